"""One training step of the real trainer, its loss and every parameter's gradient saved by the unsplit model's
names: ``python tests/train/pipeline_step.py OUT CONFIG SNAPSHOT VARIANTS_JSON``, under torchrun (a pipeline)
or as one process (the reference). VARIANTS_JSON maps a name to its ``--set`` overrides; each variant is a
Trainer of its own (its own run) in the same process group, so one launch checks several schedules.

Writes ``OUT/<name>-rank<r>.pt``: {"loss": the step's loss as rank 0 reports it, "grads": {name: grad}}
for the parameters this rank holds, after the tied copies' gradients are summed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from pipeline.config import load_config
from pipeline.train.trainer import Trainer


def main(out: Path, config_path: Path, snapshot: str, variants: dict[str, list[str]]) -> None:
    for name, overrides in variants.items():
        config = load_config(config_path, [*overrides, f"train.run_id={name}", "train.resume=false"])
        trainer = Trainer(config, snapshot)
        parallelism = trainer.parallelism
        step = parallelism.forward_backward(trainer.next_batches())
        parallelism.finish_gradients()
        loss = trainer.ctx.all_reduce(step.loss_sum.clone())
        grads = {
            key: p.grad.detach().clone() for key, p in parallelism.named_parameters() if p.grad is not None
        }
        torch.save({"loss": loss, "grads": grads}, out / f"{name}-rank{trainer.ctx.rank}.pt")
        trainer.metrics.close("FINISHED")
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]))
