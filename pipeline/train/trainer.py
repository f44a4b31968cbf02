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
states are re-seeded. With ``train.checkpoint_format=dcp`` every rank writes its own shards
(``DistributedCheckpointManager``, optionally in the background) and a step also resumes at another layout:
another ``pp_degree``, FSDP or not.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from tqdm import tqdm

from pipeline.config import PipelineConfig
from pipeline.core.config import ConfigError
from pipeline.core.manifest import DamagedInputError, Manifest
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.data.loader import TrainLoader, build_loader
from pipeline.data.mixture import Mixture, training_mixture
from pipeline.data.sequences import Batch
from pipeline.data.verify import verify_token_shards
from pipeline.model import GPTConfig, model_config
from pipeline.model.checkpoint import (
    CheckpointError,
    DistributedCheckpointer,
    checkpoint_format_problem,
    checkpoint_layout_problem,
    load_latest_of,
    shard_checkpointers,
)
from pipeline.model.gpt import GPT
from pipeline.model.inference import format_samples, generations
from pipeline.train.components.amp import MixedPrecision
from pipeline.train.components.checkpoint_manager import (
    CheckpointManager,
    DistributedCheckpointManager,
    PerRankState,
    RNGState,
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
from pipeline.train.components.optimizer import build_optimizer
from pipeline.train.distributed.parallelism import (
    DataParallelism,
    FullyShardedParallelism,
    Parallelism,
    StepLoss,
)
from pipeline.train.distributed.process_groups import DistributedContext, init_distributed
from pipeline.train.host_memory import keep_freed_host_memory
from pipeline.train.launcher.failures import EXIT_STOPPED, TrainingStopped
from pipeline.train.launcher.runs import (
    identity_differences,
    launched_run,
    record_run,
    resume_identity,
    run_ref,
    update_run_record,
)
from pipeline.train.threads import ThreadChoice, set_rank_threads

if TYPE_CHECKING:
    from pipeline.tracking.metric_sinks import MetricsLogger
    from pipeline.tracking.tensorboard import TensorBoardWriter
    from pipeline.train.config import TrainConfig

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

    Its parts are the attributes below, each made by one builder; how the model is split over the ranks and
    how a step runs on them is the ``parallelism``'s business, so the step itself is the same for a single
    process, data parallelism and a pipeline. The trainer is itself a checkpoint part (``train_state``: step
    and tokens seen), as torchtitan's is. ``after_step`` holds callables run with the trainer after every
    optimizer step (the fault injection of the chaos tests, ``pipeline.train.fault_injection``).
    """

    config: PipelineConfig
    train_config: TrainConfig  # config.train
    snapshot: str
    run_id: str  # the training run its launcher decided: train/<snapshot>/<run_id>/
    ctx: DistributedContext  # every rank
    device: torch.device
    threads: ThreadChoice
    mixture: Mixture  # what it reads: data.mixture, or the one snapshot being trained
    tokens_ref: DatasetRef  # the first input (every input shares its tokenizer)
    output: StageOutput
    model_config: GPTConfig
    precision: MixedPrecision
    parallelism: Parallelism  # this rank's model parts and how a step runs on them
    loader: TrainLoader
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    checkpoint: CheckpointManager
    validators: dict[str, Validator]  # per mixture source (one, named after the corpus, by default)
    metrics: MetricsLogger
    tensorboard: TensorBoardWriter | None
    throughput: Throughput
    after_step: list[Callable[[Trainer], None]]
    last_step: StepLoss  # the latest step's loss and tokens
    step: int
    tokens_seen: int
    restarts: int  # torchelastic restarts before this attempt

    def __init__(self, config: PipelineConfig, snapshot: str, input_stage: str = "tokenize") -> None:
        self.config = config
        self.train_config = config.train
        self.snapshot = snapshot
        self._stop: StopSignal | None = None
        self.ctx = init_distributed(config)
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
        if train.pp_degree > 1 and (problem := train.pipeline_problem(ctx.world_size)):
            raise ConfigError(problem)
        if train.dp_replicate > 1 and (problem := train.fsdp_problem(ctx.world_size)):
            raise ConfigError(problem)
        self.device = ctx.device
        self.threads = set_rank_threads(train)
        if self.device.type == "cpu" and train.keep_host_memory and keep_freed_host_memory():
            log.info("host allocator: freed memory is kept for the next step (train.keep_host_memory)")
        if not config.data.mixture:
            DatasetRef.of(config, input_stage, self.snapshot).require()  # the usual one-line error
        # The resolution frozen into the run's config, its snapshots checked against their digests.
        self.mixture = training_mixture(config, self.snapshot, input_stage)
        self.tokens_ref = self.mixture.refs[0]
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) == 0:  # once a run, before step 1
            damaged: DamagedInputError | None = None
            try:
                for source in self.mixture.sources:
                    for ref, manifest in zip(source.refs, source.manifests, strict=True):
                        verify_token_shards(
                            ref,
                            manifest,
                            checksums=config.data.verify_shards,
                            rank=ctx.rank,
                            world_size=ctx.world_size,
                        )
            except DamagedInputError as exc:
                damaged = exc
            # Each rank read its share of the files: every rank fails, with the same finding, or none does.
            found = ctx.first_message(str(damaged) if damaged else None)
            if found is not None:
                raise DamagedInputError(found) from None
        self.model_config = build_model_config(config, self.mixture.tokenizer["vocab_size"])
        self.precision = MixedPrecision(train.precision, self.device)
        self.parallelism = build_parallelism(config, self.model_config, ctx, self.precision)
        log.info("%s", self.parallelism.describe())
        data = self.parallelism.data  # the ranks that share the data
        self.loader = build_loader(self.mixture, config, rank=data.rank, world_size=data.world_size)

        self.run_id = self._check_run()
        self.output = StageOutput(
            run_ref(config, self.snapshot, self.run_id), config, self.mixture.refs, resumable=True
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
            update_run_record(self.output.path, **self._lineage())
        ctx.barrier()

        self.optimizer = build_optimizer(
            self.parallelism.module, train, self.device, process_group=data.group
        )
        self.scheduler = build_lr_scheduler(self.optimizer, train)
        self.step = 0
        self.tokens_seen = 0
        self.checkpoint = self._build_checkpoint()
        restored = self._load_checkpoint()
        if restored is not None:
            self.checkpoint.restore(*restored)
            log.info(
                "resumed from step %d (checkpoint of %d ranks)",
                self.step,
                len(restored[1]["rank_states"]["ranks"]),
            )
        else:
            seed_everything(config.project.seed + 1_000_003 * (ctx.rank + 1))  # dropout differs per rank

        self.validators = {
            source.name: Validator(
                source.folders("validation"),
                seq_len=train.seq_len,
                batch_size=train.batch_size,
                sequences=train.eval_sequences,
                rank=data.rank,  # under a pipeline each dp group's pp ranks pass the same windows along
                world_size=data.world_size,
                device=self.device,
                document_masking=train.document_masking,
                lockstep=self.parallelism.lockstep_forward,
            )
            for source in self.mixture.sources
        }
        if ctx.is_main:
            _truncate_metrics(self.output.path / METRICS_FILE, after_step=self.step)
        self.metrics, self.tensorboard = build_metrics(
            config, ctx, self.output.path, self.snapshot, self.mixture.refs
        )
        if ctx.is_main:
            self.metrics.record_lineage(self._lineage())
        peak = peak_flops_per_device(train, self.device)
        self.throughput = Throughput(
            self.model_config.flops_per_token(train.seq_len), peak * ctx.world_size if peak else None
        )
        self.after_step = []
        self.last_step = StepLoss(torch.zeros((), device=self.device), 0)
        self._grad_norm = torch.zeros((), device=self.device)

    def _check_run(self) -> str:
        """The run to write: the one the launcher decided (``train.run_id``), checked by rank 0 for all."""
        verdict: dict[str, str] = {}
        if self.ctx.is_main:
            try:
                verdict = {"run": launched_run(self.config, self.snapshot)}
            except ConfigError as exc:
                verdict = {"error": str(exc)}
        verdict = self.ctx.broadcast_object(verdict)
        if "error" in verdict:
            raise ConfigError(verdict["error"])
        return verdict["run"]

    def _lineage(self) -> dict[str, Any]:
        """What the run was trained on (run.json, the MLflow run, the manifest, hence the model card and the
        registry): every input manifest (source, corpus, snapshot, digest) and the one tokenizer's digest."""
        return {
            "inputs": self.mixture.lineage(),
            "tokenizer_digest": self.mixture.tokenizer_digest,
            "mixture": self.mixture.names if self.loader.reports_sources else None,
        }

    def _build_checkpoint(self) -> CheckpointManager:
        """Every stateful part, registered once. ``train.checkpoint_format=torch``: the parallelism says
        where this rank's files go (its data rank 0 writes them, the model and optimizer gathered whole);
        ``dcp``: it gives this rank's shards of the model and optimizer, which every rank writes, and the
        per-rank state is gathered over every rank (the layout may change on resume)."""
        parallelism, data = self.parallelism, self.parallelism.data
        metadata = {
            "config_hash": self.config.hash,
            "resume_identity": resume_identity(self.config),
            "model_config": asdict(self.model_config),
            **parallelism.checkpoint_metadata(),
        }
        distributed = self.train_config.checkpoint_format == "dcp"
        own_parts = {"rng": RNGState(self.device), **parallelism.rank_states()}
        states = {
            **(
                parallelism.sharded_states(self.optimizer)
                if distributed
                else {
                    "model": parallelism.model_state(),
                    "optimizer": parallelism.optimizer_state(self.optimizer),
                }
            ),
            "lr_scheduler": self.scheduler,
            "precision": self.precision,
            "dataloader": self.loader,
            "train_state": self,
            # After train_state: a resume on another number of ranks re-seeds with the restored step.
            "rank_states": PerRankState(
                self.ctx if distributed else data,
                own_parts,
                on_other_world_size=self._reseed_after_resharding,
            ),
        }
        if distributed:
            return DistributedCheckpointManager(
                self.output.path / "checkpoints",
                states=states,
                is_main=self.ctx.is_main,
                keep_last=self.train_config.keep_checkpoints,
                metadata=metadata,
                async_save=self.train_config.checkpoint_async,
            )
        return CheckpointManager(
            parallelism.checkpoint_folder(self.output.path / "checkpoints"),
            states=states,
            is_main=data.is_main,
            keep_last=self.train_config.keep_checkpoints,
            metadata=metadata,
        )

    def _load_checkpoint(self) -> tuple[int, dict[str, Any]] | None:
        """Rank 0 picks the newest valid checkpoint and checks it fits this run; every rank then loads it.

        Under a pipeline rank 0 (pp rank 0) checks every pp rank's shard and picks a step all of them hold.
        A DCP checkpoint is one folder per step whatever the layout; every rank reads its ``state.pt``."""
        ctx = self.ctx
        root, ranks = self.output.path / "checkpoints", self.train_config.pp_degree
        distributed = self.train_config.checkpoint_format == "dcp"
        shards = shard_checkpointers(root, ranks)
        decision: dict[str, Any] = {}
        state = None
        if ctx.is_main:
            for shard in shards:
                shard.remove_partial_saves()
            DistributedCheckpointer(root).remove_partial_saves()
            try:
                if problem := checkpoint_format_problem(root, self.train_config.checkpoint_format):
                    raise CheckpointError(problem)
                if not distributed and (problem := checkpoint_layout_problem(root, ranks)):
                    raise CheckpointError(problem)
                if distributed:
                    newest = DistributedCheckpointer(root).load_latest()
                    restored = None if newest is None else (newest[0], [newest[1]])
                else:
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
        step = decision["step"]
        if state is None:
            if distributed:  # rank 0 verified every file
                state = DistributedCheckpointer(root).load_state(step, verify_shards=False)
            else:
                state = self.checkpoint.files.load(step)
        return step, state

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

    def train_step(self) -> None:
        """One optimizer step: forward and backward of ``grad_accum`` micro-batches over the parallelism, then
        clip, step (unless a gradient is not finite: counted in precision.skipped_steps), advance the schedule."""
        self.optimizer.zero_grad(set_to_none=True)
        batches = self.next_batches()
        if not self.logs_figures(self.step + 1):
            # A mixture's rows name their sources for the per-source loss; only steps that log it pay for it.
            batches = [Batch(*batch) for batch in batches]
        self.last_step = self.parallelism.forward_backward(batches)
        self._grad_norm = self.parallelism.clip_and_step(self.optimizer, self.train_config.grad_clip)
        self.scheduler.step()
        self.step += 1
        self.tokens_seen += self.last_step.tokens
        self.throughput.add_step(self.last_step.tokens)
        every = self.train_config.histogram_every
        if self.tensorboard is not None and every and self.step % every == 0:
            self.tensorboard.histograms(self.parallelism.named_parameters(), self.step)

    # --- figures ----------------------------------------------------------------------------------------

    def logs_figures(self, step: int) -> bool:
        """Whether the training figures of ``step`` are logged: every ``log_every`` steps and the last."""
        return step % self.train_config.log_every == 0 or step == self.train_config.steps

    def _train_metrics(self) -> dict[str, float]:
        loss = self.parallelism.reported_loss(self.last_step)
        figures: dict[str, float] = {
            "loss": round(loss, 6),
            "lr": float(self.scheduler.get_last_lr()[0]),
            "grad_norm": round(float(self._grad_norm), 6),
        }
        figures.update(self.throughput.collect())  # after the .item() above, so the device work is done
        figures["tokens_seen"] = self.tokens_seen
        figures["skipped_steps"] = self.precision.skipped_steps
        if self.precision.loss_scale is not None:
            figures["loss_scale"] = self.precision.loss_scale
        figures.update(memory_metrics(self.device))
        figures.update(router_metrics(self.parallelism))
        figures.update(self.parallelism.metrics())
        figures.update(self._source_metrics())
        return figures

    def _source_metrics(self) -> dict[str, float]:
        """A declared mixture's figures per source: the latest step's token-mean loss on each source's rows
        (``loss.<source>``, collective; left out where the parallelism has no per-row losses: a pipeline) and
        the passes over each source so far (``epochs.<source>``)."""
        if not self.loader.reports_sources:
            return {}
        figures: dict[str, float] = {}
        rows = self.last_step.rows
        if rows is not None:
            row_loss, row_tokens, row_sources = rows
            totals = torch.zeros(len(self.mixture.sources), 2, dtype=torch.float64, device=self.device)
            totals[:, 0].index_add_(0, row_sources, row_loss.double())
            totals[:, 1].index_add_(0, row_sources, row_tokens.double())
            self.ctx.all_reduce(totals)
            for name, (loss_sum, tokens) in zip(self.mixture.names, totals.tolist(), strict=True):
                if tokens:
                    figures[f"loss.{name}"] = round(loss_sum / tokens, 6)
        epochs = self.loader.source_figures().get("source_epochs", {})
        figures.update({f"epochs.{name}": round(value, 6) for name, value in epochs.items()})
        return figures

    def evaluate(self) -> dict[str, float]:
        """Validation loss (collective). A declared mixture's: each source's on its own validation split
        (``val_loss.<source>``), and the mixture's ``val_loss``, their mean weighted as the training draws them
        (over the sources that have a validation split)."""
        with self.throughput.excluded():
            losses = {
                name: validator.evaluate_with(self.parallelism.validation_loss, self.ctx.all_reduce)
                for name, validator in self.validators.items()
            }
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # give evaluation's activations back before training resumes
        weights = dict(zip(self.mixture.names, self.mixture.weights, strict=True))
        known = {name: loss for name, loss in losses.items() if loss is not None}
        if not known:
            return {}
        val_loss = sum(weights[name] * loss for name, loss in known.items()) / sum(weights[n] for n in known)
        figures = {"val_loss": round(val_loss, 6), "val_perplexity": round(perplexity(val_loss), 4)}
        if self.loader.reports_sources:
            figures.update({f"val_loss.{name}": round(loss, 6) for name, loss in known.items()})
        return figures

    # --- checkpoints ------------------------------------------------------------------------------------

    def save_checkpoint(self, wait: bool = False) -> Path:
        """Collective: ZeRO-1 consolidates the optimizer on rank 0, which writes the file; every rank's
        files are written before rank 0 publishes or lists them. An asynchronous save (DCP) returns while it
        writes; ``wait``: not before it is published (the last one, and on SIGTERM)."""
        with self.throughput.excluded():
            path = self.checkpoint.save(self.step)
            if wait:
                self.checkpoint.wait()
            self.ctx.barrier()
            # Rank 0's MLflow run gets a LoggedModel, naming where the checkpoint is once the run is published.
            self.metrics.log_checkpoint(self.step, self.output.ref.path / path.relative_to(self.output.path))
            return path

    # --- the loop ---------------------------------------------------------------------------------------

    def run(self) -> Manifest | None:
        """Train to ``train.steps`` and publish the output (rank 0 returns its manifest).

        Raises TrainingStopped after SIGTERM, once the checkpoint is written.
        """
        train, ctx = self.train_config, self.ctx
        status = "FAILED"
        ending: BaseException | None = None
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
                    for hook in self.after_step:
                        hook(self)
                    stopping = ctx.any_rank(stop.received)
                    last = self.step == train.steps
                    figures: dict[str, float] = {}
                    if self.logs_figures(self.step):
                        figures.update(self._train_metrics())
                        progress.set_postfix(loss=f"{figures['loss']:.4f}", refresh=False)
                    if (train.eval_every and self.step % train.eval_every == 0) or last:
                        figures.update(self.evaluate())
                    if figures:
                        self.metrics.log(figures, self.step)
                    if stopping:
                        path = self.save_checkpoint(wait=True)
                        log.warning("SIGTERM: checkpoint of step %d written to %s; stopping", self.step, path)
                        raise TrainingStopped(self.step, path)
                    if self.step % train.checkpoint_every == 0 or last:
                        self.save_checkpoint(wait=last)
            manifest = self._publish()
            status = "FINISHED"
            return manifest
        except BaseException as exc:
            if isinstance(exc, TrainingStopped):
                status = "KILLED"
            ending = exc
            raise
        finally:
            progress.close()
            self.metrics.close(status)
            self.ctx.close()
            if self._output_entered:
                # Published, stopped or failed: the run is not locked for the rest of this process's life (one
                # that trains in-process and goes on, as tests and benchmarks do, would keep a launch out).
                self.output.__exit__(type(ending) if ending else None, ending, None)

    def _data_figures(self) -> dict[str, Any]:
        """Samples drawn and passes made per declared mixture source, for run.json and the manifest; none for
        a single snapshot."""
        return self.loader.source_figures()

    def _write_samples(self) -> None:
        """Greedy continuations of tracking.sample_prompts into TensorBoard's text tab (rank 0)."""
        tokenizer_file = self.tokens_ref.path / "tokenizer.json"
        if self.tensorboard is None or not self.config.tracking.sample_tokens or not tokenizer_file.is_file():
            return
        model = self.parallelism.whole_model
        if model is None:
            log.info("no samples: rank 0 holds only part of the model")
            return
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        stop_id = tokenizer.token_to_id(self.config.bpe.eos_token)
        with self.precision.autocast():
            samples = generations(
                model,
                tokenizer,
                self.config.tracking.sample_prompts,
                self.config.tracking.sample_tokens,
                stop_id,
            )
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
            evaluated = [row for row in history if "val_loss" in row]
            by_source = {
                key.removeprefix("val_loss."): value
                for key, value in (evaluated[-1] if evaluated else {}).items()
                if key.startswith("val_loss.")
            }
            data = self._data_figures()
            update_run_record(self.output.path, **data)
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
                    "pipeline": self.parallelism.layout(),
                    "precision": self.train_config.precision,
                    "data_parallel": self.train_config.data_parallel,
                    "dp_replicate": self.train_config.dp_replicate,
                    "grad_compression": self.train_config.grad_compression,
                    "model_config": asdict(self.model_config),
                    "mlflow_run_id": self.metrics.mlflow_run_id,
                    "run_id": self.run_id,
                    "val_loss_by_source": by_source or None,
                    **self._lineage(),
                    **data,
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


# --- builders -------------------------------------------------------------------------------------------


def build_parallelism(
    config: PipelineConfig, model_config: GPTConfig, ctx: DistributedContext, precision: MixedPrecision
) -> Parallelism:
    """The model, built from the same seed on every rank, and the parallelism that splits and runs it: a
    pipeline when ``train.pp_degree`` > 1 (cut from the very weights one process would train), FSDP2 when
    ``train.data_parallel`` is fsdp, else data parallelism (one process, DDP or ZeRO-1)."""
    seed_everything(config.project.seed)  # the same initial weights on every rank
    model = GPT(model_config).to(ctx.device)
    if config.train.pp_degree > 1:
        from pipeline.train.distributed.pipeline_parallel import PipelineParallelism

        return PipelineParallelism(model, ctx, config, precision)
    if config.train.data_parallel == "fsdp":
        return FullyShardedParallelism(model, ctx, config, precision)
    return DataParallelism(model, ctx, config, precision)


def build_metrics(
    config: PipelineConfig, ctx: DistributedContext, output_dir: Path, snapshot: str, inputs: list[DatasetRef]
) -> tuple[MetricsLogger, TensorBoardWriter | None]:
    """The metrics sinks (MLflow on rank 0, TensorBoard, Prometheus, metrics.jsonl) and TensorBoard's writer."""
    from pipeline.tracking.metric_sinks import TensorBoardMetrics, build_metrics_logger

    metrics = build_metrics_logger(
        config,
        rank=ctx.rank,
        local_rank=ctx.local_rank,
        output_dir=output_dir,
        snapshot=snapshot,
        inputs=inputs,
    )
    tensorboard = next((s.writer for s in metrics.sinks if isinstance(s, TensorBoardMetrics)), None)
    return metrics, tensorboard


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
    """Train in this process as its only rank (tests, benchmarks): the launcher's decision of the run
    (``pipeline.train.launcher.launch.name_run``) first, then the trainer."""
    from pipeline.train import fault_injection
    from pipeline.train.launcher.launch import name_run

    trainer = Trainer(config.with_run(name_run(config, snapshot)), snapshot, input_stage)
    fault_injection.arm(trainer)
    return trainer.run()
