"""The per-rank training loop, started by torchrun. Composes model, data, optimizer and checkpointer."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from pipeline.core.config import PipelineConfig, TrainConfig
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.data.loader import PackedSequences, build_train_loader
from pipeline.model import GPTConfig, model_config
from pipeline.model.gpt import GPT
from pipeline.train.checkpoint import Checkpointer

log = logging.getLogger(__name__)
STAGE = "train"
METRICS_FILE = "metrics.jsonl"


def resolve_backend(requested: str) -> str:
    if requested != "auto":
        return requested
    return "nccl" if torch.cuda.is_available() else "gloo"


def build_model_config(config: PipelineConfig, vocab_size: int) -> GPTConfig:
    base = model_config(config.model.preset, **config.model.overrides)
    return base.with_overrides(
        vocab_size=vocab_size,
        max_position_embeddings=max(base.max_position_embeddings, config.train.seq_len),
    )


def build_optimizer(model: torch.nn.Module, train: TrainConfig) -> torch.optim.Optimizer:
    """Weight decay on matrices only; norms and biases are left alone."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": train.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=train.lr, betas=(0.9, 0.95))


def warmup_cosine(train: TrainConfig):
    def factor(step: int) -> float:
        if step < train.warmup_steps:
            return (step + 1) / train.warmup_steps
        progress = min(1.0, (step - train.warmup_steps) / max(1, train.steps - train.warmup_steps))
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return train.min_lr_ratio + (1 - train.min_lr_ratio) * cosine

    return factor


@torch.no_grad()
def evaluate(model: torch.nn.Module, folder: Path, train: TrainConfig, max_batches: int = 8) -> float | None:
    """Mean loss over the validation split, or None when it is too small for one sequence."""
    try:
        dataset = PackedSequences(folder, train.seq_len)
    except (FileNotFoundError, ValueError):
        return None
    model.eval()
    losses = []
    for start in range(0, min(len(dataset), max_batches * train.batch_size), train.batch_size):
        stop = min(start + train.batch_size, len(dataset))
        rows = torch.from_numpy(np.stack([dataset[i] for i in range(start, stop)]))
        losses.append(model(rows[:, :-1], rows[:, 1:]).lm_loss.item())  # without the MoE router losses
    model.train()
    return sum(losses) / len(losses) if losses else None


def train(config: PipelineConfig, snapshot: str, input_stage: str = "tokenize") -> None:
    train_cfg = config.train
    dist.init_process_group(
        resolve_backend(config.distributed.backend), init_method=config.distributed.init_method
    )
    rank, world_size = dist.get_rank(), dist.get_world_size()
    is_main = rank == 0

    tokens_ref = DatasetRef.of(config, input_stage, snapshot).require()
    tokens_manifest = tokens_ref.manifest()
    model_cfg = build_model_config(config, tokens_manifest.extra["vocab_size"])
    torch.manual_seed(config.project.seed)
    model = GPT(model_cfg)
    ddp_model = DistributedDataParallel(model)
    optimizer = build_optimizer(model, train_cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(train_cfg))
    loader = build_train_loader(
        tokens_ref.path / "train",
        config,
        rank=rank,
        world_size=world_size,
        pad_id=tokens_manifest.extra.get("pad_id"),
    )

    output = StageOutput(DatasetRef.of(config, STAGE, snapshot), config, [tokens_ref], resumable=True)
    if is_main:
        output.__enter__()
    dist.barrier()
    checkpointer = Checkpointer(output.path / "checkpoints")
    metrics_path = output.path / METRICS_FILE

    start_step = 0
    restored = checkpointer.load_latest()
    if restored is not None and restored[1].get("config_hash") == config.hash:
        start_step, state = restored
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        loader.load_state_dict(state["loader"])
        log.info("resumed from step %d", start_step)
    elif restored is not None:
        log.warning("ignoring checkpoints written with a different config; starting from step 0")
    if is_main:
        _truncate_metrics(metrics_path, after_step=start_step)
    log.info(
        "training %s (%.2fM params) on %d rank(s) for %d steps",
        config.model.preset,
        model.num_parameters() / 1e6,
        world_size,
        train_cfg.steps,
    )

    tokens_per_step = train_cfg.batch_size * train_cfg.seq_len * train_cfg.grad_accum * world_size
    progress = tqdm(
        total=train_cfg.steps,
        initial=start_step,
        disable=not (is_main and sys.stderr.isatty()),
        desc="train",
        unit="step",
    )
    loss_avg = torch.zeros(())
    for step in range(start_step + 1, train_cfg.steps + 1):
        started = time.perf_counter()
        loss_avg.zero_()
        for micro in range(train_cfg.grad_accum):
            batch = next(loader)
            sync = micro == train_cfg.grad_accum - 1
            # Skip the gradient all-reduce on all but the last micro-batch.
            with contextlib.nullcontext() if sync else ddp_model.no_sync():
                _, loss = ddp_model(batch.inputs, batch.targets)
                (loss / train_cfg.grad_accum).backward()
            loss_avg += loss.detach() / train_cfg.grad_accum
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip or float("inf"))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        dist.all_reduce(loss_avg, op=dist.ReduceOp.SUM)  # gloo has no AVG
        loss_avg /= world_size
        elapsed = time.perf_counter() - started
        progress.update(1)
        if is_main and step % train_cfg.log_every == 0:
            record = {
                "step": step,
                "loss": round(loss_avg.item(), 6),
                "lr": scheduler.get_last_lr()[0],
                "grad_norm": round(float(grad_norm), 6),
                "tokens_per_s": round(tokens_per_step / elapsed, 1),
                "step_time_s": round(elapsed, 4),
            }
            with open(metrics_path, "a") as handle:
                handle.write(json.dumps(record) + "\n")
            progress.set_postfix(loss=f"{record['loss']:.3f}")
        if is_main and (step % train_cfg.checkpoint_every == 0 or step == train_cfg.steps):
            checkpointer.save(
                step,
                {
                    "step": step,
                    "config_hash": config.hash,
                    "model_config": asdict(model_cfg),
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "loader": loader.state_dict(),
                },
            )
    progress.close()

    val_loss = evaluate(model, tokens_ref.path / "validation", train_cfg)
    dist.barrier()
    if is_main:
        history = [json.loads(line) for line in metrics_path.read_text().splitlines()]
        final_checkpoint = checkpointer.path_for(train_cfg.steps).relative_to(output.path).as_posix()
        manifest = output.commit(
            rows={"steps": train_cfg.steps},
            counters={"tokens_seen": tokens_per_step * train_cfg.steps},
            extra={
                "final_loss": history[-1]["loss"] if history else None,
                "first_loss": history[0]["loss"] if history else None,
                "val_loss": val_loss,
                "checkpoint": final_checkpoint,
                "world_size": world_size,
                "parameters": model.num_parameters(),
                "model_config": asdict(model_cfg),
            },
        )
        log.info(
            "training done: final loss %s, checkpoint %s/%s",
            manifest.extra["final_loss"],
            manifest.path,
            final_checkpoint,
        )
    dist.barrier()
    dist.destroy_process_group()


def _truncate_metrics(path: Path, after_step: int) -> None:
    """A resumed run rewrites the steps after its checkpoint, so drop any lines logged past it."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= after_step]
    path.write_text("".join(line + "\n" for line in kept))
