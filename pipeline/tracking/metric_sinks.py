"""Training metrics in torchtitan's spirit: small sinks with ``log(metrics, step)`` / ``close()``, one fan-out.

``build_metrics_logger`` composes, from the config, what a rank should write:

- rank 0: ``metrics.jsonl`` in the train output (what the report stage reads), the MLflow training run
  (batched), TensorBoard events (``tracking.tensorboard``), and one ECS log line per step with
  ``pretrain.*`` fields (the Kibana "training progress" panels);
- every rank: a Prometheus ``/metrics`` endpoint on ``tracking.prometheus_port + LOCAL_RANK`` when set.

A sink that cannot start (MLflow unreachable, port taken) is logged as an error and left out unless
``tracking.required`` is true; it never stops training silently or otherwise.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from pipeline.config import PipelineConfig
from pipeline.core.storage import DatasetRef

log = logging.getLogger(__name__)
METRICS_FILE = "metrics.jsonl"


class MetricSink(Protocol):
    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def close(self, status: str = "FINISHED") -> None: ...


class JsonlMetrics:
    """One JSON object per step, ``{"step": n, ...}``, appended and flushed."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (open for the whole run)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._handle.write(json.dumps({"step": step, **metrics}) + "\n")
        self._handle.flush()

    def close(self, status: str = "FINISHED") -> None:
        self._handle.close()


class MlflowMetrics:
    """Per-step metrics into a ``TrackedRun``; ends the run on close only when it started it."""

    def __init__(self, run, owns_run: bool) -> None:
        self.run = run
        self.owns_run = owns_run
        self._input_tags: dict[str, Any] = {}  # what record_lineage found, for each checkpoint's LoggedModel
        # The latest loss and evaluation figures as logged (value, step, timestamp): what a checkpoint is
        # judged by; the same timestamp lets the store keep one row of each in the run's history.
        self._scores: dict[str, tuple[float, int, int]] = {}

    @property
    def run_id(self) -> str:
        return self.run.run_id

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self.run.log_metrics(metrics, step, timestamp_ms=now)
        for key, value in metrics.items():
            if ("loss" in key or "perplexity" in key) and isinstance(value, int | float):
                self._scores[key] = (float(value), step, now)

    def record_lineage(self, lineage: Mapping[str, Any]) -> None:
        """What the run trained on: tags (the tokenizer digest, the inputs as corpus/snapshot@digest) and
        the whole record as the artifact ``lineage/inputs.json``."""
        inputs = lineage.get("inputs") or []
        listed = ",".join(f"{i['corpus']}/{i['snapshot']}@{i['digest'][:12]}" for i in inputs)
        self._input_tags = {
            "pretrain.tokenizer_digest": lineage.get("tokenizer_digest") or "",
            "pretrain.inputs": listed[:5000],  # MLflow's tag values stop at 8000 characters
            "pretrain.input_count": len(inputs),
        }
        self.run.set_tags(self._input_tags)
        self.run.log_text(json.dumps(lineage, indent=2, sort_keys=True) + "\n", "lineage/inputs.json")

    def log_checkpoint(self, step: int, path: Path) -> str:
        """The checkpoint as a LoggedModel of the run: its step, losses and evaluation figures (each at the
        step it was measured), tagged with its path and the corpora the run trained on."""
        return self.run.log_logged_model(
            f"step-{step:06d}",
            self._scores,
            params={"step": step, "checkpoint": str(path)},
            tags={"pretrain.checkpoint": str(path), "pretrain.step": step, **self._input_tags},
            model_type="checkpoint",
        )

    def close(self, status: str = "FINISHED") -> None:
        if self.owns_run:
            self.run.finish(status)
        else:
            self.run.flush()


class TensorBoardMetrics:
    def __init__(self, log_dir: Path) -> None:
        from pipeline.tracking.tensorboard import TensorBoardWriter

        self.writer = TensorBoardWriter(log_dir)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.writer.scalars(metrics, step)

    def close(self, status: str = "FINISHED") -> None:
        self.writer.close()


class PrometheusMetrics:
    """Feeds a ``TrainingExporter``; ``tokens`` in the metrics is the count trained on at this step."""

    def __init__(self, exporter) -> None:
        self.exporter = exporter

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.exporter.update(
            step,
            loss=metrics.get("loss"),
            tokens_per_s=metrics.get("tokens_per_s"),
            step_time_s=metrics.get("step_time_s"),
            tokens=metrics.get("tokens"),
            lr=metrics.get("lr"),
            grad_norm=metrics.get("grad_norm"),
        )

    def close(self, status: str = "FINISHED") -> None:
        self.exporter.close()


class LogLineMetrics:
    """One INFO line per step whose ECS fields (``pretrain.step``, ``pretrain.loss``...) Kibana can chart."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger("pipeline.train.progress")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        fields = {
            f"pretrain.{key}": value for key, value in metrics.items() if isinstance(value, int | float)
        }
        shown = " ".join(
            f"{key}={value:.4g}" for key, value in metrics.items() if isinstance(value, int | float)
        )
        self.logger.info("step %d %s", step, shown, extra={"pretrain.step": step, **fields})

    def close(self, status: str = "FINISHED") -> None:
        pass


class MetricsLogger:
    """Fans one ``log(metrics, step)`` out to every sink; a sink that raises is reported, then dropped."""

    def __init__(self, sinks: Iterable[MetricSink] = (), required: bool = False) -> None:
        self.sinks = list(sinks)
        self.required = required

    @property
    def mlflow_run_id(self) -> str | None:
        """For the train manifest's ``extra["mlflow_run_id"]``, so the report finds the run."""
        return next((sink.run_id for sink in self.sinks if isinstance(sink, MlflowMetrics)), None)

    def record_lineage(self, lineage: Mapping[str, Any]) -> None:
        """The run's inputs into the sinks that keep them (MLflow), under the sinks' failure policy."""
        for sink in list(self.sinks):
            if isinstance(sink, MlflowMetrics):
                try:
                    sink.record_lineage(lineage)
                except Exception as exc:
                    if self.required:
                        raise
                    log.error("recording the inputs in MLflow failed: %s", exc, exc_info=exc)

    def log_checkpoint(self, step: int, path: Path) -> list[str]:
        """A checkpoint just written, as a LoggedModel in each sink that keeps models (rank 0's MLflow run),
        under the sinks' failure policy; returns their model ids."""
        ids = []
        for sink in list(self.sinks):
            if isinstance(sink, MlflowMetrics):
                try:
                    ids.append(sink.log_checkpoint(step, path))
                except Exception as exc:
                    if self.required:
                        raise
                    log.error("the LoggedModel of checkpoint %s failed: %s", path, exc, exc_info=exc)
        return ids

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for sink in list(self.sinks):
            try:
                sink.log(metrics, step)
            except Exception as exc:
                if self.required:
                    raise
                log.error("metrics sink %s failed and is dropped: %s", type(sink).__name__, exc, exc_info=exc)
                self.sinks.remove(sink)

    def close(self, status: str = "FINISHED") -> None:
        for sink in self.sinks:
            try:
                sink.close(status)
            except Exception as exc:
                if self.required:
                    raise
                log.error("closing metrics sink %s failed: %s", type(sink).__name__, exc)


def _optional(what: str, required: bool, build):
    try:
        return build()
    except Exception as exc:
        if required:
            raise
        log.error(
            "%s is off for this run: %s (set tracking.required=true to fail instead)", what, exc, exc_info=exc
        )
        return None


def build_metrics_logger(
    config: PipelineConfig,
    *,
    rank: int,
    local_rank: int,
    output_dir: Path,
    snapshot: str,
    inputs: Iterable[DatasetRef] = (),
) -> MetricsLogger:
    """The sinks this rank should write to (see the module docstring)."""
    required = config.tracking.required
    sinks: list[MetricSink] = []
    if rank == 0:
        sinks.append(JsonlMetrics(Path(output_dir) / METRICS_FILE))
        if config.tracking.stage_runs:

            def mlflow_sink():
                import os

                from pipeline.tracking.mlflow_runs import ENV_RUN_ID, TrackedRun

                owns = not os.environ.get(ENV_RUN_ID)
                return MlflowMetrics(TrackedRun.for_training(config, snapshot, list(inputs)), owns_run=owns)

            sinks.append(_optional("MLflow metrics", required, mlflow_sink))
        if config.tracking.tensorboard:
            from pipeline.tracking.tensorboard import tensorboard_dir

            sinks.append(
                _optional("TensorBoard", required, lambda: TensorBoardMetrics(tensorboard_dir(output_dir)))
            )
        sinks.append(LogLineMetrics())
    if config.tracking.prometheus_port is not None:

        def prometheus_sink():
            from pipeline.tracking.prometheus import TrainingExporter

            port = config.tracking.prometheus_port
            exporter = TrainingExporter(
                port + local_rank if port else 0, config.tracking.prometheus_addr, rank=rank
            )
            return PrometheusMetrics(exporter.start())

        sinks.append(_optional("the Prometheus endpoint", required, prometheus_sink))
    return MetricsLogger([sink for sink in sinks if sink is not None], required=required)
