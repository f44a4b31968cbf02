"""The per-rank trainer (started by torchrun): composes the components and runs the loop.

One step: ``grad_accum`` micro-batches forward/backward (DDP reduces gradients on the last one only), then
unscale, clip and step unless a gradient is not finite, advance the LR schedule. Every step the ranks agree
on whether any of them got SIGTERM (one tiny CPU all-reduce); on log steps the loss is all-reduced and the
figures go to the metrics sinks. Checkpoints every ``checkpoint_every`` steps, on SIGTERM and at the end.

Each stateful part is registered once with the ``CheckpointManager`` (torchtitan-style): model, optimizer,
LR schedule, loss scaler, data loader position, the trainer's own step and token count, and per rank the RNG
states and the compression hook's carried errors. A resumed run hands every part its state back, so with the
same number of ranks it continues exactly as an uninterrupted run would (bit for bit on CPU). With another
number of ranks (an elastic restart with fewer workers) the data loader reshards its position and the RNG
states are re-seeded.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from tqdm import tqdm

from pipeline.config import PipelineConfig
from pipeline.core.config import ConfigError
from pipeline.core.manifest import Manifest
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.data.loader import Batch, DistributedBatchLoader, TokenBudgetBatchLoader, build_train_loader
from pipeline.data.verify import verify_token_shards
from pipeline.model import GPTConfig, model_config
from pipeline.model.gpt import GPT
from pipeline.train.components.amp import MixedPrecision
from pipeline.train.components.checkpoint import (
    Checkpointer,
    CheckpointError,
    CheckpointManager,
    PerRankState,
    RNGState,
    load_latest_of,
    seed_everything,
)
from pipeline.train.components.evaluation import Validator, perplexity
from pipeline.train.components.lr_schedule import build_lr_scheduler
from pipeline.train.components.metrics import (
    Throughput,
    memory_metrics,
    peak_flops_per_device,
    router_metrics,
)
from pipeline.train.components.optimizer import OptimizerState, build_optimizer
from pipeline.train.compression import CompressionState, GradientCompression, build_compression
from pipeline.train.failures import EXIT_STOPPED, TrainingStopped
from pipeline.train.faults import Fault, fault_for, maybe_inject
from pipeline.train.host_memory import keep_freed_host_memory
from pipeline.train.parallel import DistributedContext, data_parallel, init_distributed, settle_buckets
from pipeline.train.pipeline_parallel import (
    Pipeline,
    PipelineModelState,
    checkpoint_layout_problem,
    shard_folder,
)
from pipeline.train.runs import identity_differences, record_run, resolve_run, resume_identity, run_ref
from pipeline.train.threads import set_rank_threads

if TYPE_CHECKING:
    from pipeline.core.config import TrainConfig
    from pipeline.tracking.metrics import MetricsLogger
    from pipeline.tracking.tensorboard import TensorBoardWriter

log = logging.getLogger(__name__)
METRICS_FILE = "metrics.jsonl"
__all__ = ["EXIT_STOPPED", "Trainer", "TrainingStopped", "train"]


def build_model_config(config: PipelineConfig, vocab_size: int) -> GPTConfig:
    base = model_config(config.model.preset, **config.model.overrides)
    return base.with_overrides(
        vocab_size=vocab_size,
        max_position_embeddings=max(base.max_position_embeddings, config.train.seq_len),
    )


class StopSignal:
    """SIGTERM asks for a checkpoint and a clean exit at the end of the current step."""

    def __init__(self) -> None:
        self.received = False
        self._previous: Any = None
        self._installed = False

    def _handle(self, signum, frame) -> None:
        self.received = True

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)


class Trainer(Stateful):
    """Builds everything for one rank in ``__init__`` (resuming when a checkpoint exists); ``run()`` trains.

    It is itself a checkpoint part (``train_state``: step and tokens seen), as torchtitan's trainer is.
    """

    config: PipelineConfig
    train_config: TrainConfig  # config.train
    snapshot: str
    run_id: str  # the training run: train/<snapshot>/<run_id>/
    ctx: DistributedContext
    device: torch.device
    tokens_ref: DatasetRef
    output: StageOutput
    model_config: GPTConfig
    model: GPT | torch.nn.ModuleList  # the whole model; under a pipeline this rank's stages (their parts)
    pipeline: (
        Pipeline | None
    )  # train.pipeline_stages > 1: this rank's stages, their schedule, the pp x dp mesh
    parallel_model: torch.nn.Module  # DDP around model; model itself on one rank (and under a pipeline)
    forward_model: torch.nn.Module  # parallel_model, compiled when train.compile
    precision: MixedPrecision
    loader: DistributedBatchLoader | TokenBudgetBatchLoader
    compression: GradientCompression | None  # a DDP comm hook; None without DDP or train.grad_compression
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    checkpoint: CheckpointManager
    validator: Validator
    metrics: MetricsLogger
    tensorboard: TensorBoardWriter | None
    throughput: Throughput
    fault: Fault | None
    step: int
    tokens_seen: int
    restarts: int  # torchelastic restarts before this attempt

    def __init__(self, config: PipelineConfig, snapshot: str, input_stage: str = "tokenize") -> None:
        self.config = config
        self.train_config = config.train
        self.snapshot = snapshot
        self._stop: StopSignal | None = None
        self.ctx: DistributedContext = init_distributed(config)
        self._output_entered = False
        try:
            self._build(input_stage)
        except BaseException as exc:
            if self._output_entered:  # a refused resume must not keep the run locked for this process's life
                self.output.__exit__(type(exc), exc, exc.__traceback__)
            self.ctx.close()
            raise

    # --- set-up ---------------------------------------------------------------------------------------

    def _build(self, input_stage: str) -> None:
        config, train, ctx = self.config, self.train_config, self.ctx
        if train.pipeline_stages > 1 and (problem := train.pipeline_problem(ctx.world_size)):
            raise ConfigError(problem)
        self.device = ctx.device
        self.threads = set_rank_threads(train)
        if self.device.type == "cpu" and train.keep_host_memory and keep_freed_host_memory():
            log.info("host allocator: freed memory is kept for the next step (train.keep_host_memory)")
        self.tokens_ref = DatasetRef.of(config, input_stage, self.snapshot).require()
        tokens_manifest = self.tokens_ref.manifest()
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) == 0:  # once a run, before step 1
            verify_token_shards(
                self.tokens_ref,
                tokens_manifest,
                checksums=config.data.verify_shards,
                rank=ctx.rank,
                world_size=ctx.world_size,
            )
        self.model_config = build_model_config(config, tokens_manifest.extra["vocab_size"])
        seed_everything(config.project.seed)  # the same initial weights on every rank
        self.precision = MixedPrecision(train.precision, self.device)
        self.pipeline = None
        self.model = GPT(self.model_config).to(self.device)
        if train.pipeline_stages > 1:
            # Cut from the same initial weights a single process would train.
            self.pipeline = Pipeline(self.model, ctx, config, self.precision)
            self.model = torch.nn.ModuleList(self.pipeline.models)
            log.info(
                "pipeline: %d stage(s) on %d pp rank(s) x %d dp rank(s), %s, %d micro-batches, theoretical "
                "bubble %.3f; %s; this rank holds stage(s) %s",
                self.pipeline.split.num_stages,
                self.pipeline.pp.world_size,
                self.pipeline.dp.world_size,
                train.pipeline_schedule,
                self.pipeline.microbatches,
                self.pipeline.theoretical_bubble,
                self.pipeline.split.describe(),
                self.pipeline.stage_indices,
            )
        data = self.pipeline.dp if self.pipeline is not None else ctx  # whose ranks share the data

        self.run_id = self._agree_on_run()
        self.config = config = config.with_run(self.run_id)  # what the metrics sinks and checkpoints record
        self.output = StageOutput(
            run_ref(config, self.snapshot, self.run_id), config, [self.tokens_ref], resumable=True
        )
        self.restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        if ctx.is_main:
            # Only when the training starts: a restart after a failure continues what this one began.
            if not train.resume and self.restarts == 0 and self.output.path.exists():
                log.warning("train.resume=false: starting run %s over (%s)", self.run_id, self.output.path)
                shutil.rmtree(self.output.path)
            self.output.__enter__()
            self._output_entered = True
            record_run(self.output.path, config, self.run_id)
        ctx.barrier()

        # A pipeline's stages are data parallel each (Pipeline wraps them), the rank's parts together are not.
        self.parallel_model = data_parallel(self.model, ctx, train) if self.pipeline is None else self.model
        self.loader = build_train_loader(
            self.tokens_ref.path / "train",
            config,
            rank=data.rank,
            world_size=data.world_size,
            pad_id=tokens_manifest.extra.get("pad_id"),
        )
        if self.pipeline is not None:
            self.pipeline.settle(Batch(*self._placeholder_batch(), self._placeholder_batch()[0]))
        settle_buckets(self.parallel_model, self._placeholder_batch, self.precision.autocast)
        self.compression = None
        if self.parallel_model is not self.model:
            self.compression = build_compression(
                train.grad_compression,
                ctx.world_size,
                powersgd_rank=train.powersgd_rank,
                powersgd_start_step=train.powersgd_start_step,
                seed=config.project.seed,
            )
            if self.compression is not None:
                self.compression.register(self.parallel_model)
        elif train.grad_compression != "none":
            log.info("one process: no gradient all-reduce, so train.grad_compression has nothing to do")
        self.optimizer = build_optimizer(self.model, train, self.device, process_group=data.group)
        self.scheduler = build_lr_scheduler(self.optimizer, train)
        self.forward_model = torch.compile(self.parallel_model) if train.compile else self.parallel_model

        self.step = 0
        self.tokens_seen = 0
        own_parts: dict[str, Stateful] = {"rng": RNGState(self.device)}
        if self.compression is not None:
            own_parts["compression"] = CompressionState(self.compression, self.device)
        checkpoints = self.output.path / "checkpoints"
        metadata = {
            "config_hash": config.hash,
            "resume_identity": resume_identity(config),
            "model_config": asdict(self.model_config),
        }
        if self.pipeline is not None:
            # Stage-sharded: each pp rank's dp rank 0 writes its stages' parts into a folder of its own.
            checkpoints = self.pipeline.checkpoint_folder(checkpoints)
            metadata["pipeline"] = {**self.pipeline.layout(), "stages": self.pipeline.stage_indices}
        self.checkpoint = CheckpointManager(
            checkpoints,
            states={
                "model": PipelineModelState(self.pipeline) if self.pipeline is not None else self.model,
                "optimizer": OptimizerState(self.optimizer, data.rank),
                "lr_scheduler": self.scheduler,
                "precision": self.precision,
                "dataloader": self.loader,
                "train_state": self,
                # After train_state: a resume on another number of ranks re-seeds with the restored step.
                "rank_states": PerRankState(
                    data, own_parts, on_other_world_size=self._reseed_after_resharding
                ),
            },
            is_main=data.is_main,
            keep_last=train.keep_checkpoints,
            metadata=metadata,
        )
        restored = self._load_checkpoint()
        if restored is not None:
            self.checkpoint.load(restored)
            log.info(
                "resumed from step %d (checkpoint of %d ranks)",
                self.step,
                len(restored["rank_states"]["ranks"]),
            )
        else:
            seed_everything(config.project.seed + 1_000_003 * (ctx.rank + 1))  # dropout differs per rank

        self.validator = Validator(
            self.tokens_ref.path / "validation",
            seq_len=train.seq_len,
            batch_size=train.batch_size,
            sequences=train.eval_sequences,
            rank=data.rank,  # under a pipeline each dp group's pp ranks pass the same windows along
            world_size=data.world_size,
            device=self.device,
            document_masking=train.document_masking,
        )
        if ctx.is_main:
            _truncate_metrics(self.output.path / METRICS_FILE, after_step=self.step)
        from pipeline.tracking.metrics import TensorBoardMetrics, build_metrics_logger

        self.metrics = build_metrics_logger(
            config,
            rank=ctx.rank,
            local_rank=ctx.local_rank,
            output_dir=self.output.path,
            snapshot=self.snapshot,
            inputs=[self.tokens_ref],
        )
        self.tensorboard = next(
            (s.writer for s in self.metrics.sinks if isinstance(s, TensorBoardMetrics)), None
        )
        peak = peak_flops_per_device(train, self.device)
        self.throughput = Throughput(
            self.model_config.flops_per_token(train.seq_len), peak * ctx.world_size if peak else None
        )
        self.fault = fault_for(ctx.rank)
        self._loss_sum = torch.zeros((), device=self.device)
        self._step_tokens = 0
        self._grad_norm = torch.zeros((), device=self.device)

    def _agree_on_run(self) -> str:
        """The run to write: the one the config names (the launcher names it), else rank 0's choice."""
        decision: dict[str, str] = {}
        if self.ctx.is_main:
            try:
                decision = {"run": resolve_run(self.config, self.snapshot)}
            except ConfigError as exc:
                decision = {"error": str(exc)}
        decision = self.ctx.broadcast_object(decision)
        if "error" in decision:
            raise ConfigError(decision["error"])
        return decision["run"]

    def _placeholder_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (self.train_config.batch_size, self.train_config.seq_len)
        zeros = torch.zeros(shape, dtype=torch.long, device=self.device)
        return zeros, zeros

    def _load_checkpoint(self) -> dict[str, Any] | None:
        """Rank 0 picks the newest valid checkpoint and checks it fits this run; every rank then loads it."""
        ctx, files = self.ctx, self.checkpoint.files
        root, ranks = self.output.path / "checkpoints", self.train_config.pipeline_stages
        # Under a pipeline rank 0 (pp rank 0) checks every pp rank's shard and picks a step all of them hold.
        shards = [Checkpointer(root / shard_folder(r, ranks)) for r in range(ranks)] if ranks > 1 else [files]
        decision: dict[str, Any] = {}
        state = None
        if ctx.is_main:
            for shard in shards:
                shard.remove_partial_saves()
            try:
                if problem := checkpoint_layout_problem(root, ranks):
                    raise CheckpointError(problem)
                restored = load_latest_of(shards)
            except CheckpointError as exc:
                decision = {"error": str(exc)}
            else:
                if restored is not None:
                    step, (state, *_) = restored
                    differences = identity_differences(
                        state.get("resume_identity", {}), resume_identity(self.config)
                    )
                    if differences:
                        decision = {
                            "error": f"the unfinished run {self.run_id} in {self.output.path} (checkpoint of "
                            f"step {step}) was trained with other settings:\n  "
                            + "\n  ".join(differences)
                            + "\nresume it with the same settings, leave train.run_id unset for a new run, "
                            "or set train.resume=false to start this one over"
                        }
                    else:
                        decision = {"step": step}
        decision = ctx.broadcast_object(decision)
        if "error" in decision:
            raise CheckpointError(decision["error"])
        if "step" not in decision:
            return None
        if state is None:
            state = files.load(decision["step"])
        return state

    def _reseed_after_resharding(self, saved_ranks: int) -> None:
        log.warning(
            "resuming a %d-rank checkpoint on %d ranks: RNG states re-seeded, compression errors reset",
            saved_ranks,
            self.ctx.world_size,
        )
        seed_everything(self.config.project.seed + 1_000_003 * (self.ctx.rank + 1) + self.step)

    @property
    def stopping(self) -> bool:
        """Whether SIGTERM asked this rank to stop (the job is being stopped, or preempted)."""
        return self._stop is not None and self._stop.received

    # --- checkpoint part ``train_state`` ----------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "tokens_seen": self.tokens_seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.tokens_seen = int(state["tokens_seen"])

    # --- one step ---------------------------------------------------------------------------------------

    def next_batches(self) -> list[Batch]:
        return [next(self.loader) for _ in range(self.train_config.grad_accum)]

    def forward_backward(self, batches: list[Batch]) -> None:
        """Gradients of the token-mean loss over all ranks' micro-batches (DDP averages over ranks)."""
        ctx, train = self.ctx, self.train_config
        self.optimizer.zero_grad(set_to_none=True)
        if self.pipeline is not None:  # its micro-batches are train.microbatches slices of one batch
            (batch,) = batches
            self._step_tokens = batch.num_tokens * self.pipeline.dp.world_size  # packed: every row is full
            self._loss_sum = self.pipeline.forward_backward(batch.to(self.device), self._step_tokens)
            return
        local_tokens = [batch.num_tokens for batch in batches]
        if self.config.data.batching == "packed":
            step_tokens = sum(local_tokens) * ctx.world_size  # every row is full
        else:
            step_tokens = ctx.sum_cpu(sum(local_tokens))
        loss_sum = torch.zeros((), device=self.device)
        ddp = self.parallel_model is not self.model
        for index, batch in enumerate(batches):
            batch = batch.to(self.device, non_blocking=True)
            last = index == len(batches) - 1
            # Reduce gradients once per step, on the last micro-batch.
            with contextlib.nullcontext() if last or not ddp else self.parallel_model.no_sync():
                with self.precision.autocast():
                    out = self.forward_model(
                        batch.inputs, batch.targets, batch.document_ids if train.document_masking else None
                    )
                share = local_tokens[index] / step_tokens
                self.precision.backward(out.loss * (share * ctx.world_size))
            loss_sum += out.lm_loss.detach().float() * share
        self._loss_sum = loss_sum
        self._step_tokens = step_tokens

    def optimizer_step(self) -> None:
        """Clip, step (unless a gradient is not finite: counted in precision.skipped_steps), advance the schedule."""
        pipeline = self.pipeline
        if pipeline is not None:
            pipeline.sync_tied_gradients()
        self._grad_norm = self.precision.step(
            self.optimizer,
            self.model.parameters(),
            self.train_config.grad_clip,
            total_norm=pipeline.total_norm if pipeline is not None else None,
            agree_found_inf=pipeline.agree_found_inf if pipeline is not None else None,
        )
        self.scheduler.step()
        self.step += 1
        self.tokens_seen += self._step_tokens
        self.throughput.add_step(self._step_tokens)

    def train_step(self) -> None:
        self.forward_backward(self.next_batches())
        self.optimizer_step()
        every = self.train_config.histogram_every
        if self.tensorboard is not None and every and self.step % every == 0:
            parts = self.pipeline if self.pipeline is not None else self.model
            self.tensorboard.histograms(parts.named_parameters(), self.step)

    # --- figures ----------------------------------------------------------------------------------------

    def _train_metrics(self) -> dict[str, float]:
        loss = self.ctx.all_reduce(self._loss_sum.clone()).item()
        figures: dict[str, float] = {
            "loss": round(loss, 6),
            "lr": self.scheduler.get_last_lr()[0],
            "grad_norm": round(float(self._grad_norm), 6),
        }
        figures.update(self.throughput.collect())  # after the .item() above, so the device work is done
        figures["tokens_seen"] = self.tokens_seen
        figures["skipped_steps"] = self.precision.skipped_steps
        if self.precision.loss_scale is not None:
            figures["loss_scale"] = self.precision.loss_scale
        figures.update(memory_metrics(self.device))
        figures.update(router_metrics(self.pipeline if self.pipeline is not None else self.model))
        if self.pipeline is not None:
            figures.update(self.pipeline.bubble_metrics())
        if self.compression is not None:
            figures.update(self.compression.stats.collect())
        return figures

    def evaluate(self) -> dict[str, float]:
        with self.throughput.excluded():
            if self.pipeline is not None:  # no rank holds the whole model: forward through the stages
                val_loss = self.validator.evaluate_with(self.pipeline.validation_loss, self.ctx.all_reduce)
            else:
                val_loss = self.validator.evaluate(self.model, self.precision.autocast, self.ctx.all_reduce)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # give evaluation's activations back before training resumes
        if val_loss is None:
            return {}
        return {"val_loss": round(val_loss, 6), "val_perplexity": round(perplexity(val_loss), 4)}

    # --- checkpoints ------------------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """Collective: ZeRO-1 consolidates the optimizer on rank 0, which writes the file."""
        with self.throughput.excluded():
            path = self.checkpoint.save(self.step)
            if self.pipeline is not None:
                self.ctx.barrier()  # every pp rank's shard is written before rank 0 publishes or lists them
            return path

    # --- the loop ---------------------------------------------------------------------------------------

    def run(self) -> Manifest | None:
        """Train to ``train.steps`` and publish the output (rank 0 returns its manifest).

        Raises TrainingStopped after SIGTERM, once the checkpoint is written.
        """
        train, ctx = self.train_config, self.ctx
        status = "FAILED"
        progress = tqdm(
            total=train.steps,
            initial=self.step,
            disable=not (ctx.is_main and sys.stderr.isatty()),
            desc="train",
            unit="step",
            dynamic_ncols=True,
        )
        log.info(
            "training %s (%.2fM parameters, %.2fM active) on %d rank(s), %s, %s, %s, %s, compression %s: "
            "steps %d..%d",
            self.config.model.preset,
            self.model_config.num_parameters() / 1e6,
            self.model_config.num_active_parameters() / 1e6,
            ctx.world_size,
            self.device,
            self.threads,
            train.precision,
            train.data_parallel,
            train.grad_compression,
            self.step + 1,
            train.steps,
        )
        try:
            with StopSignal() as stop:
                self._stop = stop
                while self.step < train.steps:
                    self.train_step()
                    progress.update(1)
                    maybe_inject(self.fault, self.step, delivered=lambda: stop.received)
                    stopping = ctx.any_rank(stop.received)
                    last = self.step == train.steps
                    figures: dict[str, float] = {}
                    if self.step % train.log_every == 0 or last:
                        figures.update(self._train_metrics())
                        progress.set_postfix(loss=f"{figures['loss']:.4f}", refresh=False)
                    if (train.eval_every and self.step % train.eval_every == 0) or last:
                        figures.update(self.evaluate())
                    if figures:
                        self.metrics.log(figures, self.step)
                    if stopping:
                        path = self.save_checkpoint()
                        ctx.barrier()  # nobody exits before rank 0 has the file
                        log.warning("SIGTERM: checkpoint of step %d written to %s; stopping", self.step, path)
                        raise TrainingStopped(self.step, path)
                    if self.step % train.checkpoint_every == 0 or last:
                        self.save_checkpoint()
            manifest = self._publish()
            status = "FINISHED"
            return manifest
        except TrainingStopped:
            status = "KILLED"
            raise
        finally:
            progress.close()
            self.metrics.close(status)
            self.ctx.close()

    def _write_samples(self) -> None:
        """Greedy continuations of tracking.sample_prompts into TensorBoard's text tab (rank 0)."""
        tokenizer_file = self.tokens_ref.path / "tokenizer.json"
        if self.tensorboard is None or not self.config.tracking.sample_tokens or not tokenizer_file.is_file():
            return
        if self.pipeline is not None:
            log.info("no samples: under a pipeline rank 0 holds only its stages")
            return
        from tokenizers import Tokenizer

        from pipeline.tracking.samples import format_samples, greedy_generate

        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        stop_id = tokenizer.token_to_id(self.config.tokenizer.eos_token)
        samples = []
        with self.precision.autocast():
            for prompt in self.config.tracking.sample_prompts:
                prompt_ids = tokenizer.encode(prompt).ids or [stop_id if stop_id is not None else 0]
                new_ids = greedy_generate(self.model, prompt_ids, self.config.tracking.sample_tokens, stop_id)
                samples.append({"prompt": prompt, "completion": tokenizer.decode(new_ids)})
        self.tensorboard.text("samples", format_samples(samples), self.step)

    def _publish(self) -> Manifest | None:
        ctx = self.ctx
        manifest = None
        if ctx.is_main:
            self._write_samples()
            path = self.output.path / METRICS_FILE
            history = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
            losses = [row["loss"] for row in history if "loss" in row]
            validation = [row["val_loss"] for row in history if "val_loss" in row]
            manifest = self.output.commit(
                rows={"steps": self.step},
                counters={"tokens_seen": self.tokens_seen, "skipped_steps": self.precision.skipped_steps},
                extra={
                    "final_loss": losses[-1] if losses else None,
                    "first_loss": losses[0] if losses else None,
                    "val_loss": validation[-1] if validation else None,
                    "val_perplexity": perplexity(validation[-1]) if validation else None,
                    "checkpoint": self.checkpoint.files.path_for(self.step)
                    .relative_to(self.output.path)
                    .as_posix(),
                    "world_size": ctx.world_size,
                    "restarts": self.restarts,
                    "parameters": self.model_config.num_parameters(),
                    "active_parameters": self.model_config.num_active_parameters(),
                    "flops_per_token": self.model_config.flops_per_token(self.train_config.seq_len),
                    "pipeline": self.pipeline.layout() if self.pipeline is not None else None,
                    "precision": self.train_config.precision,
                    "data_parallel": self.train_config.data_parallel,
                    "grad_compression": self.train_config.grad_compression,
                    "model_config": asdict(self.model_config),
                    "mlflow_run_id": self.metrics.mlflow_run_id,
                    "run_id": self.run_id,
                },
            )
            log.info(
                "training done: final loss %s, validation loss %s, checkpoint %s/%s",
                manifest.extra["final_loss"],
                manifest.extra["val_loss"],
                manifest.path,
                manifest.extra["checkpoint"],
            )
        ctx.barrier()
        return manifest


def _truncate_metrics(path: Path, after_step: int) -> None:
    """A resumed run redoes the steps after its checkpoint, so drop any lines logged past it.

    A last line without its newline was torn by a kill mid-write; it is dropped, as the log shipper leaves a
    line alone until its newline arrives. The file is replaced atomically, so a kill here loses nothing.
    """
    if not path.exists():
        return
    *complete, torn = path.read_bytes().split(b"\n")
    if torn:
        log.warning("%s: dropping a torn last line (%d bytes, no newline)", path, len(torn))
    kept = [line for line in complete if line.strip() and json.loads(line)["step"] <= after_step]
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(b"".join(line + b"\n" for line in kept))
    os.replace(temporary, path)


def train(config: PipelineConfig, snapshot: str, input_stage: str = "tokenize") -> Manifest | None:
    return Trainer(config, snapshot, input_stage).run()
