"""The registered stages as Airflow tasks: which operator runs each, and which tasks wait for which.

The DAGs say which part of the pipeline they run (the corpus stages after a crawl, the training stages,
or both); the registry (``pipeline.stages``) says which stages those are, what each reads and how it runs.
So a stage added to the registry joins `corpus_ingest`, `reprocess_corpus`, `pretrain` and the demo
`pretrain_pipeline` with no change here or in a DAG file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from airflow.sdk import BaseOperator

from operators.pytorch_job import PyTorchJobOperator
from operators.spark import PipelineSparkSubmitOperator
from operators.stage import PipelineStageOperator
from pipeline.config import PipelineConfig
from pipeline.stages import Stage, downstream, group


def crawl_shard_ids(config: PipelineConfig) -> list[int]:
    """One mapped crawl task per id: ``range(crawl.num_shards)``, split by registered domain."""
    from pipeline.crawl.sharding import shard_ids

    return shard_ids(config)


def corpus_stages(*, reports: bool) -> list[Stage]:
    """The corpus stages after the crawl, in order; ``reports=False`` keeps only those that make data."""
    return downstream("crawl", group("corpus", reports=reports))


def training_stages() -> list[Stage]:
    return group("training")


def stage_task(stage: Stage, **kwargs: Any) -> BaseOperator:
    """The task that runs one stage, by how the registry says it runs; its task id is the stage's name."""
    if stage.runner == "spark":
        return PipelineSparkSubmitOperator(stage=stage.name, input_stage=stage.default_input, **kwargs)
    if stage.runner == "torchrun":
        return PyTorchJobOperator(task_id=stage.name, input_stage=stage.default_input, **kwargs)
    return PipelineStageOperator(stage=stage.name, **kwargs)


def stage_tasks(
    stages: Iterable[Stage],
    *,
    after: BaseOperator | None = None,
    torchrun: Mapping[str, Any] | None = None,
    **common: Any,
) -> dict[str, BaseOperator]:
    """Create one task per stage in the DAG being defined; returns them by stage name, in pipeline order.

    Each task waits for the tasks of the stages it reads; one whose inputs come from outside ``stages``
    waits for ``after`` instead. ``common`` goes to every task, ``torchrun`` only to training tasks.
    """
    tasks: dict[str, BaseOperator] = {}
    for entry in stages:
        extra = dict(torchrun or {}) if entry.runner == "torchrun" else {}
        task = stage_task(entry, **common, **extra)
        upstream = [tasks[name] for name in entry.reads if name in tasks]
        if not upstream and after is not None:
            upstream = [after]
        for previous in upstream:
            previous >> task
        tasks[entry.name] = task
    return tasks
