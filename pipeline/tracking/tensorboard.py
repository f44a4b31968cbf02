"""TensorBoard: a small event writer for the trainer, and `pretrain tensorboard` to look at the events.

The trainer writes events under ``<train output>/tensorboard/`` (while it runs, that is the run's staging
folder ``<data_root>/<corpus>/train/<snapshot>/.staging-<run>@resume/``; after it commits, the run's folder).
``pretrain tensorboard --snapshot S`` shows every run of the snapshot side by side, running ones too
(``--set train.run_id=R``: that run only, wherever it is); without ``--snapshot``, every training snapshot.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig, load_config
from pipeline.core.config import ConfigError
from pipeline.core.storage import DatasetRef, local_path

EVENTS_FOLDER = "tensorboard"


def tensorboard_dir(train_output: Path) -> Path:
    return Path(train_output) / EVENTS_FOLDER


class TensorBoardWriter:
    """Scalars, histograms and text for one run (rank 0), over ``torch.utils.tensorboard.SummaryWriter``."""

    def __init__(self, log_dir: str | Path, flush_secs: int = 30) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = SummaryWriter(str(self.log_dir), flush_secs=flush_secs)

    def scalars(self, metrics: Mapping[str, float], step: int, prefix: str = "train/") -> None:
        for key, value in metrics.items():
            if value is not None:
                self._writer.add_scalar(f"{prefix}{key}", float(value), step)

    def histograms(
        self, named_tensors: Iterable[tuple[str, Any]], step: int, prefix: str = "weights/"
    ) -> None:
        """E.g. ``model.named_parameters()``; also logs ``grads/<name>`` for tensors that have a gradient."""
        for name, tensor in named_tensors:
            data = tensor.detach().float().cpu()
            self._writer.add_histogram(f"{prefix}{name}", data, step)
            grad = getattr(tensor, "grad", None)
            if grad is not None:
                self._writer.add_histogram(f"grads/{name}", grad.detach().float().cpu(), step)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        self._writer.add_text(tag, text, step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def snapshot_logdir(config: PipelineConfig, snapshot: str | None) -> Path:
    """The events of the training run ``train.run_id`` names (published, else still running), of every run
    of a snapshot (running ones too), or of every snapshot."""
    train_root = local_path(config.project.data_root) / config.project.corpus / "train"
    if snapshot is None:
        return train_root
    if config.train.run_id is None:
        return DatasetRef.of(config, "train", snapshot).snapshot_path
    run = DatasetRef.of(config, "train", snapshot)
    for candidate in (run.path, run.staging_path(resumable=True)):
        if tensorboard_dir(candidate).is_dir():
            return tensorboard_dir(candidate)
    return tensorboard_dir(run.path)


def tensorboard_command(logdir: Path, host: str, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tensorboard.main",
        "--logdir",
        str(logdir),
        "--host",
        host,
        "--port",
        str(port),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pretrain tensorboard",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: pretrain tensorboard --snapshot demo --port 6006  (then open http://127.0.0.1:6006)",
    )
    parser.add_argument("--config", "-c", metavar="YAML", help="config file (default: built-in defaults)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--snapshot", help="training snapshot (default: every snapshot of the corpus)")
    parser.add_argument("--logdir", help="event folder to show instead (overrides --snapshot)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to serve on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=6006, help="port (default: 6006)")
    parser.add_argument(
        "--print-command", action="store_true", help="print the tensorboard command, do not run it"
    )
    args = parser.parse_args(argv)
    config = load_config(args.config, args.overrides)
    logdir = Path(args.logdir) if args.logdir else snapshot_logdir(config, args.snapshot)
    if not logdir.is_dir():
        raise ConfigError(
            f"no TensorBoard events at {logdir}; the trainer writes them under <train output>/{EVENTS_FOLDER}/ "
            "when tracking.tensorboard is true"
        )
    command = tensorboard_command(logdir, args.host, args.port)
    if args.print_command:
        print(" ".join(command))
        return 0
    print(f"TensorBoard on http://{args.host}:{args.port} for {logdir}", file=sys.stderr, flush=True)
    os.execv(command[0], command)  # hand the terminal (and Ctrl-C) to TensorBoard


if __name__ == "__main__":
    from pipeline.core.cli import run_cli

    raise SystemExit(run_cli(main))
