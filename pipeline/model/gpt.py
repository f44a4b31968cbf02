"""A decoder-only Transformer in one file.

RMSNorm, rotary position embeddings, grouped-query attention through ``scaled_dot_product_attention`` with
causal / sliding-window / blockwise masks and packed-document boundaries (on CUDA, masked attention runs as
FlexAttention, which skips what the mask empties), SwiGLU MLPs or top-k mixtures of experts, activation
checkpointing, KV-cache generation, and optionally a training loss that never builds the logits
(``linear_cross_entropy``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
from torch.utils.checkpoint import checkpoint

from pipeline.model.config import GPTConfig
from pipeline.model.routing import expert_capacity, router_scores, routing_ops


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position, computed once in float64 (accurate angles at long positions)."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, head_dim: int, max_positions: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, offset: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The tables for positions offset .. offset + length - 1, each (length, head_dim / 2)."""
        return self.cos[offset : offset + length], self.sin[offset : offset + length]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (batch, heads, seq, head_dim) in the rotate-half layout: element i pairs with i + head_dim/2.

    Both outputs of a pair are computed from the original values (nothing is overwritten in place).
    """
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def position_in_document(document_ids: torch.Tensor) -> torch.Tensor:
    """For document ids (batch, seq), each token's distance from the start of its run of equal ids."""
    positions = torch.arange(document_ids.size(1), device=document_ids.device).expand_as(document_ids)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    return positions - torch.where(starts, positions, 0).cummax(dim=1).values


def attention_mask(
    config: GPTConfig,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    document_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Boolean mask (batch or 1, 1, queries, keys), True where a query may attend to a key.

    Causal, narrowed by the config's attention pattern, widened by global tokens, and cut at document
    boundaries. With document_ids (batch, seq), queries and keys are the positions 0 .. seq - 1.
    """
    q, k = query_positions[:, None], key_positions[None, :]
    causal = k <= q
    allowed = causal
    if config.attention_pattern == "sliding_window":
        assert config.attention_window is not None  # GPTConfig requires one for this pattern
        allowed = allowed & (q - k < config.attention_window)
    elif config.attention_pattern == "blockwise":
        size = config.attention_block_size
        allowed = allowed & (q // size - k // size <= config.attention_local_blocks)
    allowed, causal = allowed[None], causal[None]
    if document_ids is not None:
        same_document = document_ids[:, :, None] == document_ids[:, None, :]
        allowed, causal = allowed & same_document, causal & same_document
    if config.attention_global_tokens:
        key_rank = position_in_document(document_ids) if document_ids is not None else key_positions[None]
        allowed = allowed | (causal & (key_rank[:, None, :] < config.attention_global_tokens))
    return allowed[:, None]


def attention_mask_mod(config: GPTConfig, document_ids: torch.Tensor | None = None):
    """``attention_mask`` as a FlexAttention mask_mod (b, h, q, k) -> bool, for queries and keys 0 .. seq - 1."""
    pattern, window = config.attention_pattern, config.attention_window
    block_size, local_blocks = config.attention_block_size, config.attention_local_blocks
    global_tokens = config.attention_global_tokens
    key_rank = None
    if global_tokens and document_ids is not None:
        key_rank = position_in_document(document_ids)

    def mask_mod(b, h, q, k):
        causal = k <= q
        allowed = causal
        if pattern == "sliding_window":
            allowed = allowed & (q - k < window)
        elif pattern == "blockwise":
            allowed = allowed & (q // block_size - k // block_size <= local_blocks)
        if document_ids is not None:
            same_document = document_ids[b, q] == document_ids[b, k]
            allowed, causal = allowed & same_document, causal & same_document
        if global_tokens:
            rank = key_rank[b, k] if key_rank is not None else k
            allowed = allowed | (causal & (rank < global_tokens))
        return allowed

    return mask_mod


def _compiled(function):
    """Compiled, FlexAttention generates one fused kernel for the mask (eager, it would build the full score
    matrix). Inside a compiled model the plain function is traced into the model's graph."""
    return function if torch.compiler.is_compiling() else _compile_once(function)


@functools.cache
def _compile_once(function):
    return torch.compile(function, dynamic=False)  # on first use: importing torch._dynamo costs seconds


def flex_block_mask(config: GPTConfig, seq: int, document_ids: torch.Tensor | None, device) -> BlockMask:
    batch = document_ids.shape[0] if document_ids is not None else None
    mask_mod = attention_mask_mod(config, document_ids)
    return _compiled(create_block_mask)(mask_mod, batch, None, seq, seq, device=device)


def make_norm(config: GPTConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
    return nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps, bias=False)


class KVCache:
    """Keys and values of the positions processed so far, preallocated for max_length positions."""

    def __init__(
        self,
        config: GPTConfig,
        batch_size: int,
        max_length: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (
            config.num_hidden_layers,
            batch_size,
            config.num_key_value_heads,
            max_length,
            config.head_dim,
        )
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0  # advanced by GPT.forward once every layer has written its new positions

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + k.size(2)
        if end > self.keys.size(3):
            raise ValueError(f"KV cache holds {self.keys.size(3)} positions; {end} needed")
        self.keys[layer, :, :, self.length : end] = k
        self.values[layer, :, :, self.length : end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]


class Attention(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.kv_proj = nn.Linear(config.hidden_size, 2 * self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.dropout = config.dropout

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | BlockMask | None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """mask None means plain causal with queries aligned to the last keys (see GPT._attention_mask)."""
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k, v = self.kv_proj(x).view(batch, seq, 2, self.num_kv_heads, self.head_dim).unbind(dim=2)
        q, k, v = apply_rope(q, cos, sin), apply_rope(k.transpose(1, 2), cos, sin), v.transpose(1, 2)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)
        if isinstance(mask, BlockMask):
            # q, k, v already hold autocast's dtype; Flex runs in it, outside autocast's casting rules.
            with torch.autocast(q.device.type, enabled=False):
                y = _compiled(flex_attention)(
                    q, k, v, block_mask=mask, enable_gqa=self.num_kv_heads != self.num_heads
                )
            return self.o_proj(y.transpose(1, 2).reshape(batch, seq, -1))
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            # SDPA's is_causal aligns the top-left corner, right only for as many queries as keys; a single
            # query (decoding) sees every cached key anyway.
            is_causal=mask is None and seq > 1,
            dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=self.num_kv_heads != self.num_heads,
        )
        return self.o_proj(y.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    """SwiGLU (up_proj holds the gate and up halves) or a plain GELU MLP."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str) -> None:
        super().__init__()
        self.swiglu = activation == "swiglu"
        self.up_proj = nn.Linear(hidden_size, (2 if self.swiglu else 1) * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            gate, up = self.up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.gelu(self.up_proj(x)))


def load_balancing_loss(probs: torch.Tensor, expert_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Switch/GShard auxiliary loss E * sum_i f_i * P_i; 1 when routing is perfectly balanced.

    f_i: fraction of the T*k top-k choices that picked expert i (before capacity drops, as in Megatron);
    P_i: mean router probability of expert i. Only P_i carries a gradient.
    """
    counts = torch.bincount(expert_ids.reshape(-1).long(), minlength=num_experts).to(probs.dtype)
    return num_experts * torch.sum(counts / expert_ids.numel() * probs.mean(dim=0))


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE z-loss: mean over tokens of logsumexp(router logits)^2, keeps the logits small."""
    return torch.logsumexp(logits.float(), dim=-1).square().mean()


@dataclass
class RouterStats:
    """One MoE layer's routing in its latest forward. Tensors stay on device until read."""

    tokens_per_expert: torch.Tensor  # kept assignments per expert
    dropped: torch.Tensor  # assignments dropped for capacity
    assignments: int  # tokens x top_k
    aux_loss: torch.Tensor
    z_loss: torch.Tensor


class MoE(nn.Module):
    """Top-k mixture of SwiGLU experts with capacity, behind the route/permute/unpermute interface."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        size, activation = config.expert_intermediate_size, config.activation
        self.router = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = nn.ModuleList(
            MLP(config.hidden_size, size, activation) for _ in range(config.num_experts)
        )
        self.shared_expert = MLP(config.hidden_size, size, activation) if config.moe_shared_expert else None
        self.ops = routing_ops(config.moe_fused_routing)
        self.stats: RouterStats | None = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns the MoE output and this layer's unweighted load-balancing and z losses."""
        config, shape = self.config, x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.router(x)
        factor = config.moe_capacity_factor if self.training else config.moe_eval_capacity_factor
        capacity = expert_capacity(len(x), config.num_experts, config.moe_top_k, factor)
        plan = self.ops.route(logits, config.moe_top_k, capacity, config.router_score)

        grouped = self.ops.permute(x, plan)
        offsets = plan.expert_offsets.tolist()
        # Every expert runs, even on an empty slice, so each one is in the graph (DDP expects all grads).
        expert_output = torch.cat(
            [expert(grouped[offsets[e] : offsets[e + 1]]) for e, expert in enumerate(self.experts)]
        )
        out = self.ops.unpermute(expert_output, plan)  # dropped assignments add nothing
        if self.shared_expert is not None:
            out = out + self.shared_expert(x)

        probs = router_scores(logits, config.router_score)
        if config.router_score == "sigmoid":
            probs = probs / probs.sum(dim=-1, keepdim=True)
        aux_loss = load_balancing_loss(probs, plan.expert_ids, config.num_experts)
        z_loss = router_z_loss(logits)
        self.stats = RouterStats(
            tokens_per_expert=plan.expert_counts.detach(),
            dropped=plan.dropped.sum().detach(),
            assignments=plan.dropped.numel(),
            aux_loss=aux_loss.detach(),
            z_loss=z_loss.detach(),
        )
        return out.view(shape), aux_loss, z_loss


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.attn_norm = make_norm(config)
        self.attn = Attention(config, layer_idx)
        self.mlp_norm = make_norm(config)
        self.mlp: MoE | MLP
        if layer_idx in config.moe_layer_indices:
            self.mlp = MoE(config)
        else:
            self.mlp = MLP(config.hidden_size, config.intermediate_size, config.activation)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, cos, sin, mask, cache=None):
        """Returns the new residual stream and, for an MoE block, its (aux_loss, z_loss)."""
        x = x + self.dropout(self.attn(self.attn_norm(x), cos, sin, mask, cache))
        if isinstance(self.mlp, MoE):
            out, aux_loss, z_loss = self.mlp(self.mlp_norm(x))
            return x + self.dropout(out), (aux_loss, z_loss)
        return x + self.dropout(self.mlp(self.mlp_norm(x))), None


def training_loss(
    config: GPTConfig,
    logits: torch.Tensor,
    targets: torch.Tensor,
    aux_loss: torch.Tensor | None,
    z_loss: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, lm_loss): the token-mean cross-entropy plus the weighted router losses (see GPTOutput)."""
    lm_loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)
    return with_router_losses(config, lm_loss, aux_loss, z_loss), lm_loss


def with_router_losses(
    config: GPTConfig, lm_loss: torch.Tensor, aux_loss: torch.Tensor | None, z_loss: torch.Tensor | None
) -> torch.Tensor:
    if aux_loss is None or z_loss is None:
        return lm_loss
    return lm_loss + config.router_aux_loss_coef * aux_loss + config.router_z_loss_coef * z_loss


@dataclass
class GPTOutput:
    """What GPT.forward returns. ``logits, loss = model(...)`` unpacks the first two fields.

    loss = lm_loss + router_aux_loss_coef * aux_loss + router_z_loss_coef * z_loss, so one backward()
    trains the routers too; log lm_loss. aux_loss and z_loss are summed over MoE layers (None if dense).
    logits is None when the config's fused_cross_entropy is on and targets are given: the loss then comes
    from the hidden states without the (batch, seq, vocab) logits. Without targets logits are always there.
    """

    logits: torch.Tensor | None
    loss: torch.Tensor | None = None
    lm_loss: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None
    z_loss: torch.Tensor | None = None

    def __iter__(self):
        return iter((self.logits, self.loss))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.dropout = nn.Dropout(config.dropout)
        self.rope = RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.num_hidden_layers))
        self.norm = make_norm(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.apply(self._init_weights)
        # GPT-2 style: shrink residual projections so the residual stream does not grow with depth.
        for name, param in self.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(param, std=config.initializer_range / math.sqrt(2 * config.num_hidden_layers))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=self.config.initializer_range)

    def forward(
        self,
        input_ids: torch.Tensor,
        targets: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> GPTOutput:
        """input_ids, targets, document_ids: (batch, seq). Targets of -100 are ignored.

        document_ids: per-token ids from packed data; a token attends only to earlier tokens with its id.
        cache: continue after the cache's positions, appending this call's keys and values to it.
        A pipeline stage (pipeline.train.distributed.pipeline_parallel) lacks the embedding or the head: without the
        embedding input_ids is the previous stage's residual stream (batch, seq, hidden); without the head
        ``logits`` is this stage's residual stream. With fused_cross_entropy on and targets given, ``logits``
        is None (see GPTOutput).
        """
        batch, seq = input_ids.shape[:2]
        offset = cache.length if cache is not None else 0
        if offset + seq > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {offset + seq} exceeds max_position_embeddings "
                f"{self.config.max_position_embeddings}"
            )
        if document_ids is not None:
            if document_ids.shape != (batch, seq):
                raise ValueError(
                    f"document_ids shape {tuple(document_ids.shape)} != input_ids {(batch, seq)}"
                )
            if cache is not None:
                raise ValueError("document_ids are not supported together with a KV cache")
        cos, sin = self.rope(offset, seq)
        mask = self._attention_mask(offset, seq, document_ids, input_ids.device, cache is not None)
        recompute = self.config.activation_checkpointing and self.training and torch.is_grad_enabled()

        x = input_ids if self.embed_tokens is None else self.dropout(self.embed_tokens(input_ids))
        aux_losses, z_losses = [], []
        for block in self.blocks:
            if recompute and cache is None:
                x, router_losses = checkpoint(block, x, cos, sin, mask, use_reentrant=False)
            else:
                x, router_losses = block(x, cos, sin, mask, cache)
            if router_losses is not None:
                aux_losses.append(router_losses[0])
                z_losses.append(router_losses[1])
        if cache is not None:
            cache.length += seq
        # fused_cross_entropy: the loss straight from the normed hidden states and the head weight.
        fused = targets is not None and self.lm_head is not None and self.config.fused_cross_entropy != "off"
        if self.lm_head is None:
            logits = x
        elif fused:
            logits = None
        else:
            logits = self.lm_head(self.norm(x))

        out = GPTOutput(logits)
        if aux_losses:
            out.aux_loss, out.z_loss = torch.stack(aux_losses).sum(), torch.stack(z_losses).sum()
        if fused and targets is not None:
            # Imported on first use: its torch.compiler decorators import torch._dynamo (1-2 s), which a
            # model without fused_cross_entropy (the default; evaluate, report, generate) never needs.
            from pipeline.model.linear_cross_entropy import linear_cross_entropy

            out.lm_loss = linear_cross_entropy(
                self.norm(x),
                self.lm_head.weight,
                targets,
                self.config.fused_cross_entropy,
                self.config.fused_cross_entropy_chunk_size,
            )
            out.loss = with_router_losses(self.config, out.lm_loss, out.aux_loss, out.z_loss)
        elif targets is not None:
            assert logits is not None  # only the fused loss goes without them
            out.loss, out.lm_loss = training_loss(self.config, logits, targets, out.aux_loss, out.z_loss)
        return out

    def _attention_mask(
        self,
        offset: int,
        seq: int,
        document_ids: torch.Tensor | None,
        device: torch.device,
        cached: bool = False,
    ) -> torch.Tensor | BlockMask | None:
        """Built once per forward for all layers; None where SDPA's own causal path (or no mask) is exact.

        A BlockMask (FlexAttention) on CUDA without a KV cache, unless dropout is active (Flex has none).
        """
        plain_causal = self.config.attention_pattern == "causal" and document_ids is None
        if plain_causal and (offset == 0 or seq == 1):
            return None
        dropout_active = self.training and self.config.dropout > 0
        if (
            self.config.attention_kernel == "auto"
            and device.type == "cuda"
            and not cached
            and not dropout_active
        ):
            return flex_block_mask(self.config, seq, document_ids, device)
        positions = torch.arange(offset + seq, device=device)
        return attention_mask(self.config, positions[offset:], positions, document_ids)

    def router_stats(self) -> list[dict]:
        """Per MoE layer, the routing of the latest forward: tokens per expert (kept), drops, losses."""
        stats = []
        for layer, block in enumerate(self.blocks):
            if isinstance(block.mlp, MoE) and block.mlp.stats is not None:
                s = block.mlp.stats
                dropped = int(s.dropped)
                stats.append(
                    {
                        "layer": layer,
                        "tokens_per_expert": s.tokens_per_expert.tolist(),
                        "dropped": dropped,
                        "drop_rate": dropped / s.assignments if s.assignments else 0.0,
                        "aux_loss": float(s.aux_loss),
                        "z_loss": float(s.z_loss),
                    }
                )
        return stats

    def num_parameters(self) -> int:
        """All parameters; a tied embedding/lm_head matrix counts once."""
        return sum(p.numel() for p in self.parameters())

    def num_active_parameters(self) -> int:
        """Parameters one token uses: in each MoE layer only top_k of the routed experts."""
        inactive = 0
        for block in self.blocks:
            if isinstance(block.mlp, MoE):
                per_expert = sum(p.numel() for p in block.mlp.experts[0].parameters())
                inactive += (self.config.num_experts - self.config.moe_top_k) * per_expert
        return self.num_parameters() - inactive

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token; see GPTConfig.flops_per_token for the formula."""
        return self.config.flops_per_token(seq_len)

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        top_p: float | None = None,
        stop_token: int | None = None,
    ) -> torch.Tensor:
        """Continue each row of input_ids (batch, seq) by up to max_new_tokens tokens, using a KV cache.

        temperature 0 decodes greedily; top_k keeps only the k most likely tokens and top_p the smallest set
        whose probability reaches p (nucleus) before sampling. A row that emits stop_token (end of text) ends
        there: its later positions repeat stop_token, and decoding stops once every row has ended, so the
        result may be shorter than seq + max_new_tokens. Runs in eval mode (no dropout,
        moe_eval_capacity_factor) and restores the previous mode.
        """
        if max_new_tokens < 0 or temperature < 0 or (top_k is not None and top_k < 1):
            raise ValueError(
                f"need max_new_tokens >= 0, temperature >= 0 and top_k >= 1; got {max_new_tokens}, "
                f"{temperature}, {top_k}"
            )
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        batch, seq = input_ids.shape
        if seq == 0:
            raise ValueError("generate needs at least one prompt token per row")
        total = seq + max_new_tokens
        if total > self.config.max_position_embeddings:
            raise ValueError(
                f"prompt ({seq}) + max_new_tokens ({max_new_tokens}) exceeds max_position_embeddings "
                f"{self.config.max_position_embeddings}"
            )
        was_training = self.training
        self.eval()
        try:
            cache = KVCache(self.config, batch, total, input_ids.device, self.lm_head.weight.dtype)
            tokens = [input_ids]
            ended = torch.zeros(batch, 1, dtype=torch.bool, device=input_ids.device)
            logits = self(input_ids, cache=cache).logits[:, -1]
            for step in range(max_new_tokens):
                next_token = sample_next_token(logits, temperature, top_k, generator, top_p)
                if stop_token is not None:
                    next_token = next_token.masked_fill(ended, stop_token)
                    ended |= next_token == stop_token
                tokens.append(next_token)
                if step + 1 == max_new_tokens or bool(ended.all()):
                    break
                logits = self(next_token, cache=cache).logits[:, -1]
        finally:
            self.train(was_training)
        return torch.cat(tokens, dim=1)


def sample_next_token(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None,
    generator: torch.Generator | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """One token per row (batch, 1) from last-position logits (batch, vocab)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        # Keep the most likely tokens up to and including the one whose cumulative probability reaches top_p.
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        before = torch.softmax(ordered, dim=-1).cumsum(dim=-1) - torch.softmax(ordered, dim=-1)
        remove = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, before >= top_p)
        logits = logits.masked_fill(remove, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
