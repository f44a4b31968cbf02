"""The `train` and `distributed` config sections; docs/training.md explains each group of keys."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal, Protocol

from pydantic import Field, field_validator, model_validator

from pipeline.core.config import CHOOSES_LAUNCHER, NAMES_OUTPUT, Section
from pipeline.core.storage import validate_run_id

if TYPE_CHECKING:
    from pipeline.data.config import DataConfig
    from pipeline.model.config import ModelSection

# Sane bounds, checked before any work: a typo such as a 23-digit step count or a 10^8-token sequence
# otherwise runs until killed or dies allocating the RoPE tables.
MAX_STEPS = 10**9
MAX_SEQ_LEN = 1 << 17


class TrainingTree(Protocol):
    """The sections ``train``'s cross-section checks read; ``pipeline.config.PipelineConfig`` is one."""

    @property
    def model(self) -> ModelSection: ...

    @property
    def data(self) -> DataConfig: ...


class TrainConfig(Section):
    """The trainer (pipeline.train); docs/training.md explains each group of keys.

    Pipeline-parallel keys use torchtitan's words (``pp_*``), so "stage" alone means a registry stage."""

    renamed_keys: ClassVar[dict[str, str]] = {
        "pipeline_stages": "pp_degree",
        "pipeline_schedule": "pp_schedule",
        "microbatches": "pp_microbatches",
        "stages_per_rank": "pp_virtual_stages",
    }

    steps: int = Field(40, gt=0, le=MAX_STEPS, description="optimizer steps")
    batch_size: int = Field(8, gt=0, le=1 << 16, description="sequences per rank per micro-step")
    seq_len: int = Field(64, gt=1, le=MAX_SEQ_LEN, description="tokens per training sequence")
    grad_accum: int = Field(
        1,
        gt=0,
        le=1 << 16,
        description="micro-steps per optimizer step (a pipeline runs train.pp_microbatches)",
    )
    lr: float = Field(3e-3, gt=0, le=10, description="peak learning rate (AdamW)")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="the cosine decays to lr x this")
    warmup_steps: int = Field(5, ge=0, le=MAX_STEPS, description="linear warm-up steps before the cosine")
    weight_decay: float = Field(0.1, ge=0, description="AdamW decay of matrices; norms and biases get none")
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW betas")
    optimizer: Literal["adamw", "muon"] = Field(
        "adamw",
        description="adamw: AdamW on every parameter; muon: torch.optim.Muon on the blocks' 2-D weights "
        "(attention and MLP matrices) and AdamW (train.lr, betas, weight_decay) on the token embedding, "
        "the LM head, norms and biases",
    )
    muon_lr: float = Field(
        0.02, gt=0, le=10, description="Muon's peak learning rate (the same warm-up and cosine as train.lr)"
    )
    muon_momentum: float = Field(0.95, ge=0, lt=1, description="Muon's (Nesterov) momentum")
    muon_weight_decay: float = Field(
        0.0, ge=0, description="Muon's decoupled weight decay (each step scales by 1 - muon_lr x this)"
    )
    muon_adjust_lr: Literal["original", "match_rms_adamw"] = Field(
        "original",
        description="Muon's per-matrix lr scale: original, sqrt(max(1, rows/cols)) (Keller Jordan's); "
        "match_rms_adamw, 0.2 sqrt(max(rows, cols)) (Moonshot's), so an AdamW lr carries over to muon_lr",
    )
    grad_clip: float = Field(1.0, ge=0, description="clip the global gradient norm to this; 0 disables")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="bf16: autocast; fp16: autocast + dynamic loss scaling (GradScaler)"
    )
    data_parallel: Literal["ddp", "zero1", "fsdp"] = Field(
        "ddp",
        description="ddp: the whole model, gradients and optimizer state on every rank; zero1: DDP plus "
        "ZeroRedundancyOptimizer (optimizer state sharded over ranks); fsdp: FSDP2 (fully_shard), "
        "parameters, gradients and optimizer state sharded over ranks and gathered per block for compute; "
        "with train.pp_degree above 1 each applies within a stage's data-parallel ranks",
    )
    dp_replicate: int = Field(
        1,
        ge=1,
        le=1 << 16,
        description="fsdp: HSDP, the data-parallel ranks as dp_replicate groups, each sharding the model "
        "over its own ranks (nodes' fast links) and all-reducing its gradient shards with the other groups' "
        "(the slow links between nodes); 1 shards over every rank (plain FSDP). Must divide the ranks",
    )
    fsdp_reshard_after_forward: bool = Field(
        True,
        description="fsdp: free each block's gathered parameters after its forward and gather them again for "
        "backward (least memory); false keeps them gathered from forward to backward (one all-gather "
        "fewer per block per micro-batch, a whole unsharded model's memory at the peak)",
    )
    grad_compression: Literal["none", "fp16", "bf16", "powersgd", "int8"] = Field(
        "none", description="DDP communication hook for the gradient all-reduce"
    )
    powersgd_rank: int = Field(1, ge=1, description="PowerSGD matrix approximation rank")
    powersgd_start_step: int = Field(
        10, ge=2, description="PowerSGD: plain all-reduce for the steps before this one"
    )
    bucket_cap_mb: float = Field(25.0, gt=0, description="DDP gradient bucket size")
    document_masking: bool = Field(
        True, description="attend only within each packed document (the loader's document_ids)"
    )
    compile: bool = Field(False, description="torch.compile the model")
    keep_host_memory: bool = Field(
        True,
        description="CPU training on glibc: keep memory freed after a step for the next one instead of "
        "returning it to the OS and page-faulting it back (pins malloc's mmap and trim thresholds)",
    )
    log_every: int = Field(1, gt=0, description="log metrics every N steps (and the last)")
    eval_every: int = Field(0, ge=0, description="validation loss every N steps; 0: only at the end")
    eval_sequences: int = Field(64, gt=0, description="validation windows per evaluation (all ranks)")
    histogram_every: int = Field(
        20, ge=0, description="TensorBoard weight and gradient histograms every N steps; 0 disables"
    )
    checkpoint_every: int = Field(20, gt=0, description="also on SIGTERM and at the end")
    keep_checkpoints: int = Field(3, ge=1, description="keep the newest K checkpoints")
    checkpoint_format: Literal["torch", "dcp"] = Field(
        "torch",
        description="torch: one torch.save file per step (per pp rank), the whole model and optimizer "
        "gathered to (data-parallel) rank 0; dcp: torch.distributed.checkpoint, every rank writes its own "
        "shards and a step resumes at another layout (data-parallel size, fsdp or not, train.pp_degree); "
        "not with train.data_parallel=zero1",
    )
    checkpoint_async: bool = Field(
        False,
        description="dcp: write checkpoints in a background thread from a copy of each rank's shards "
        "(that much more host memory) while training goes on; the next save and the end wait for it",
    )
    run_id: str | None = Field(
        None,
        json_schema_extra=NAMES_OUTPUT,
        description="the training run, stored in train/<snapshot>/<run_id>/ (its report in "
        "report/<snapshot>/<run_id>/); unset: with resume the newest unfinished run of the same settings, "
        "else a new one named after its start time. Name a run to continue it or to name a new one; a "
        "complete run is never trained again",
    )
    resume: bool = Field(
        True,
        description="continue the newest unfinished run of this snapshot trained with the same settings "
        "(or the one train.run_id names) from its newest checkpoint; false starts a new run, or starts the "
        "named one over",
    )
    peak_flops: float | None = Field(
        None,
        gt=0,
        description="peak FLOP/s of one device for MFU; default: known GPUs in bf16/fp16, else no MFU",
    )
    launcher: Literal["local", "kubernetes"] = Field(
        "local",
        json_schema_extra=CHOOSES_LAUNCHER,
        description="how an Airflow train task starts the training: local, torchrun on the worker; kubernetes, a "
        "Kubeflow job (a Trainer v2 TrainJob, or a v1 PyTorchJob, by the pretrain_kubernetes Variable's api). "
        "`pretrain train` always runs torchrun here",
    )
    nproc_per_node: int = Field(2, gt=0, description="processes torchrun starts on each node")
    nnodes: int = Field(1, gt=0, description="nodes (torchrun agents); above 1 they meet at rdzv_endpoint")
    min_nnodes: int | None = Field(
        None, gt=0, description="elastic: keep going with as few as this many nodes (--nnodes=min:max)"
    )
    max_restarts: int = Field(
        3, ge=0, description="torchrun restarts the worker group this often after a failure"
    )
    pp_degree: int = Field(
        1,
        ge=1,
        le=1024,
        description="pipeline parallelism: ranks a model is cut into by layers (the pp of a pp x dp mesh); "
        "1 keeps every rank holding the whole model",
    )
    pp_microbatches: int | None = Field(
        None,
        ge=1,
        le=1 << 16,
        description="pipeline: micro-batches train.batch_size is split into per step; default "
        "pp_degree (the fewest 1F1B accepts)",
    )
    pp_schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = Field(
        "1f1b",
        description="torch.distributed.pipelining schedule: all forwards then all backwards (gpipe), "
        "one forward one backward (1f1b), or 1F1B over pp_virtual_stages virtual stages per rank "
        "(interleaved_1f1b)",
    )
    pp_virtual_stages: int = Field(
        1, ge=1, le=64, description="virtual pipeline stages per rank; above 1 only with interleaved_1f1b"
    )
    threads_per_rank: int | None = Field(
        None,
        gt=0,
        le=1024,
        description="torch intra-op threads (and OMP_NUM_THREADS) of each rank; default: OMP_NUM_THREADS "
        "when set, else the process's usable cores (CPU affinity) / nproc_per_node, at least 1",
    )

    @field_validator("run_id")
    @classmethod
    def _run_name(cls, run_id: str | None) -> str | None:
        return None if run_id is None else validate_run_id(run_id)

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if not all(0 <= beta < 1 for beta in self.betas):
            raise ValueError(f"betas must lie in [0, 1), got {list(self.betas)}")
        if self.min_nnodes is not None and self.min_nnodes > self.nnodes:
            raise ValueError(f"min_nnodes ({self.min_nnodes}) must not exceed nnodes ({self.nnodes})")
        problem = self.fsdp_problem() or self.checkpoint_problem() or self.pipeline_problem()
        if problem:
            raise ValueError(problem)
        return self

    def fsdp_problem(self, world_size: int | None = None) -> str | None:
        """What FSDP cannot be combined with (naming the key), or None. ``world_size``: the ranks a launcher
        started (checked by each rank before it builds anything); else nproc_per_node x nnodes."""
        if self.data_parallel != "fsdp":
            if self.dp_replicate > 1:
                return (
                    f"train.dp_replicate={self.dp_replicate} replicates FSDP's shard groups (HSDP): it needs "
                    f"train.data_parallel=fsdp, not {self.data_parallel} (which replicates on every rank)"
                )
            return None
        if self.dp_replicate > 1:
            if self.pp_degree > 1:
                return (
                    f"train.dp_replicate={self.dp_replicate} with train.pp_degree={self.pp_degree}: HSDP "
                    "within pipeline stages (pp x dp_replicate x dp_shard) is not built; use train.dp_replicate=1 "
                    "(each stage sharded over its data-parallel ranks)"
                )
            ranks = world_size if world_size is not None else self.nproc_per_node * self.nnodes
            where = "WORLD_SIZE" if world_size is not None else "train.nproc_per_node x train.nnodes"
            if ranks % self.dp_replicate:
                return f"train.dp_replicate={self.dp_replicate} does not divide the {ranks} ranks ({where})"
            if (
                world_size is None
                and self.min_nnodes is not None
                and (self.min_nnodes * self.nproc_per_node) % self.dp_replicate
            ):
                return (
                    f"train.dp_replicate={self.dp_replicate} does not divide the "
                    f"{self.min_nnodes * self.nproc_per_node} ranks of train.min_nnodes"
                )
        if self.grad_compression != "none":
            return (
                f"train.grad_compression={self.grad_compression} is a DDP communication hook; "
                "train.data_parallel=fsdp reduce-scatters gradients without one: set train.grad_compression=none"
            )
        if self.precision == "fp16":
            return (
                "train.precision=fp16 with train.data_parallel=fsdp: FSDP's mixed precision here is bf16 "
                "parameters with fp32 reduction (no loss scaling); use train.precision=bf16 or fp32"
            )
        return None

    def checkpoint_problem(self) -> str | None:
        """What the checkpoint format cannot be combined with (naming the keys), or None."""
        if self.checkpoint_async and self.checkpoint_format != "dcp":
            return (
                f"train.checkpoint_async=true needs train.checkpoint_format=dcp (each rank writes its own "
                f"shards in the background), not {self.checkpoint_format}"
            )
        if self.checkpoint_format == "dcp" and self.data_parallel == "zero1":
            return (
                "train.checkpoint_format=dcp with train.data_parallel=zero1: ZeroRedundancyOptimizer's state "
                "has no sharded state dict; use train.data_parallel=fsdp (which shards the optimizer state "
                "too) or train.checkpoint_format=torch"
            )
        return None

    def tree_problem(self, tree: TrainingTree) -> str | None:
        return pipeline_layout_problem(self, tree.model.gpt().num_hidden_layers, tree.data.batching)

    @property
    def pp_microbatch_count(self) -> int:
        """Micro-batches per pipeline step: pp_microbatches, or by default pp_degree."""
        return self.pp_microbatches or self.pp_degree

    @property
    def pp_stage_count(self) -> int:
        """The model's torch ``PipelineStage``s: pp_degree ranks x pp_virtual_stages each."""
        return self.pp_degree * self.pp_virtual_stages

    def pipeline_problem(self, world_size: int | None = None) -> str | None:
        """What is wrong with the pipeline settings (naming the key), or None. ``world_size``: the ranks a
        launcher started, checked by each rank before it builds anything; else nproc_per_node x nnodes."""
        pp, m = self.pp_degree, self.pp_microbatch_count
        interleaved = self.pp_schedule == "interleaved_1f1b"
        if pp == 1:
            if self.pp_virtual_stages > 1 or self.pp_microbatches not in (None, 1):
                return (
                    "train.pp_virtual_stages and train.pp_microbatches split a pipeline; set "
                    "train.pp_degree above 1 (or leave them at 1)"
                )
            return None
        if self.grad_accum != 1:
            return (
                f"train.grad_accum={self.grad_accum}: a pipeline accumulates over train.pp_microbatches; "
                "leave train.grad_accum at 1 and raise train.pp_microbatches"
            )
        if self.grad_compression != "none" or self.compile:
            key = "train.grad_compression" if self.grad_compression != "none" else "train.compile"
            return f"{key} works on the whole model's DDP; with train.pp_degree={pp} leave it off"
        if interleaved and self.pp_virtual_stages == 1:
            return (
                "train.pp_virtual_stages: interleaved_1f1b needs at least 2 virtual stages per rank; set "
                "train.pp_virtual_stages=2 or more, or train.pp_schedule=1f1b"
            )
        if not interleaved and self.pp_virtual_stages > 1:
            return (
                f"train.pp_virtual_stages={self.pp_virtual_stages}: only interleaved_1f1b runs several "
                f"stages per rank, not {self.pp_schedule}"
            )
        # 1F1B keeps pp micro-batches in flight; interleaved rounds of pp micro-batches each (the paper's rule,
        # stricter than torch's, so every round is full and the bubble is what (p-1)/(v*m+p-1) says).
        if self.pp_schedule == "1f1b" and m < pp:
            return f"train.pp_microbatches={m}: 1f1b needs at least train.pp_degree={pp} micro-batches"
        if interleaved and m % pp:
            return f"train.pp_microbatches={m}: interleaved_1f1b needs a multiple of train.pp_degree={pp}"
        if self.batch_size % m:
            return (
                f"train.batch_size={self.batch_size} does not split into train.pp_microbatches={m} equal "
                "micro-batches"
            )
        ranks = world_size if world_size is not None else self.nproc_per_node * self.nnodes
        if ranks % pp:
            where = "WORLD_SIZE" if world_size is not None else "train.nproc_per_node x train.nnodes"
            return f"train.pp_degree={pp} does not divide the {ranks} ranks ({where})"
        if self.min_nnodes is not None and (self.min_nnodes * self.nproc_per_node) % pp:
            return (
                f"train.pp_degree={pp} does not divide the {self.min_nnodes * self.nproc_per_node} "
                "ranks of train.min_nnodes"
            )
        return None


def pipeline_layout_problem(train: TrainConfig, layers: int, batching: str) -> str | None:
    """The pipeline checks that need other sections: every stage gets at least one block, and micro-batches
    have one shape (a pipeline stage receives fixed-size activations)."""
    if train.pp_degree == 1:
        return None
    if layers < train.pp_stage_count:
        return (
            f"train.pp_degree={train.pp_degree} x train.pp_virtual_stages={train.pp_virtual_stages} "
            f"stages need at least as many layers; the model has {layers} (model.num_hidden_layers)"
        )
    if batching != "packed":
        return f"train.pp_degree={train.pp_degree} needs data.batching=packed, not {batching}"
    return None


class DistributedConfig(Section):
    """torch.distributed process group; under torchrun the env:// defaults need no change."""

    backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="auto: nccl on GPU, gloo on CPU")
    init_method: str = Field("env://", description="env://, tcp://host:port or file:///path")
    world_size: int | None = Field(None, gt=0, description="taken from torchrun's WORLD_SIZE when unset")
    rank: int | None = Field(None, ge=0, description="taken from torchrun's RANK when unset")
    timeout_s: float = Field(1800.0, gt=0, description="collective timeout")
    rdzv_endpoint: str | None = Field(
        None, description="host:port of the c10d rendezvous when nnodes > 1 (default 127.0.0.1:29400)"
    )
    rdzv_id: str | None = Field(None, description="rendezvous id; default <corpus>-<snapshot>")

    @model_validator(mode="after")
    def _rank_in_world(self) -> DistributedConfig:
        if (self.world_size is None) != (self.rank is None):
            raise ValueError("set distributed.world_size and distributed.rank together, or neither")
        if self.rank is not None and self.world_size is not None and self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is outside a world of {self.world_size}")
        if self.init_method != "env://" and self.rank is None:
            raise ValueError(f"init_method {self.init_method!r} needs distributed.world_size and rank")
        return self
