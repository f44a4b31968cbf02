"""The registered stages as Airflow tasks: which operator runs each, and which tasks wait for which.

The DAGs say which part of the pipeline they run (the corpus stages after a crawl or an ingest, the
training stages, or both); the registry (``pipeline.stages``) says which stages those are, what each reads
and how it runs. So a stage added to the registry joins `corpus_crawl`, `corpus_from_files`,
`reprocess_corpus`, `pretrain` and the demo `pretrain_pipeline` with no change here or in a DAG file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator

from operators.defaults import TRAINING_TIMEOUT
from operators.spark import PipelineSparkSubmitOperator
from operators.stage import PipelineStageOperator
from operators.train_operator import TrainOperator
from pipeline.config import PipelineConfig
from pipeline.stages import CORPUS_SOURCES, STAGES, Stage, downstream, group


def crawl_shard_ids(config: PipelineConfig) -> list[int]:
    """One mapped crawl task per id: ``range(crawl.num_shards)``, split by registered domain."""
    from pipeline.crawl.sharding import shard_ids

    return shard_ids(config)


def corpus_stages(*, reports: bool) -> list[Stage]:
    """The corpus stages after the crawl (or an ingest, which stands in for it), in order; ``reports=False``
    keeps only those that make data."""
    return downstream(CORPUS_SOURCES[0], group("corpus", reports=reports))


def source_readers(stages: Iterable[Stage]) -> list[str]:
    """The stages that read the corpus's source (a crawl or an ingest): the first ones after it."""
    return [entry.name for entry in stages if CORPUS_SOURCES[0] in entry.reads]


def training_stages() -> list[Stage]:
    return group("training")


def training_tasks(run: Any) -> dict[str, BaseOperator]:
    """The training stages of a `pretrain` DAG on what its ``training_run`` task resolved (``run``: its XCom,
    ``{snapshot, config_path}``): each reads that frozen config file as it is, and training is launched as its
    ``train.launcher`` says."""
    return stage_tasks(
        training_stages(),
        snapshot=run["snapshot"],
        config_path=run["config_path"],
        overrides=[],
        frozen_config=True,
        torchrun={"execution_timeout": TRAINING_TIMEOUT},
    )


def stage_task(stage: Stage, *, input_stage: str | None = None, **kwargs: Any) -> BaseOperator:
    """The task that runs one stage, by how the registry says it runs; its task id is the stage's name.

    ``input_stage`` replaces the stage's default input (a Jinja template is rendered at run time).
    """
    input_stage = input_stage or stage.default_input
    if stage.runner == "spark":
        return PipelineSparkSubmitOperator(stage=stage.name, input_stage=input_stage, **kwargs)
    if stage.runner == "torchrun":
        return TrainOperator(task_id=stage.name, input_stage=input_stage, **kwargs)
    return PipelineStageOperator(stage=stage.name, **kwargs)


def stage_tasks(
    stages: Iterable[Stage],
    *,
    after: BaseOperator | Sequence[BaseOperator] | None = None,
    source: str = CORPUS_SOURCES[0],
    source_readers_args: Mapping[str, Any] | None = None,
    torchrun: Mapping[str, Any] | None = None,
    **common: Any,
) -> dict[str, BaseOperator]:
    """Create one task per stage in the DAG being defined; returns them by stage name, in pipeline order.

    Each task waits for the tasks of the stages it reads; one whose inputs come from outside ``stages``
    waits for ``after`` instead. The stages that read the crawl read ``source`` (one of CORPUS_SOURCES, or a
    template naming one) and get ``source_readers_args``. ``common`` goes to every task, ``torchrun`` only
    to training tasks.
    """
    stages = list(stages)
    readers = set(source_readers(stages))
    if after is None:
        after = []
    elif isinstance(after, BaseOperator):
        after = [after]
    tasks: dict[str, BaseOperator] = {}
    for entry in stages:
        extra = dict(torchrun or {}) if entry.runner == "torchrun" else {}
        if entry.name in readers:
            extra.update(source_readers_args or {})
            if source != CORPUS_SOURCES[0]:
                extra["input_stage"] = source
        task = stage_task(entry, **common, **extra)
        upstream = [tasks[name] for name in entry.reads if name in tasks]
        if not upstream:
            upstream = list(after)
        for previous in upstream:
            previous >> task
        tasks[entry.name] = task
    return tasks


def ingest_overrides(params: Mapping[str, Any]) -> list[str]:
    """A corpus_from_files run's overrides: its ``overrides`` plus ``sources`` as ingest.sources, validated."""
    import json

    from pipeline.config import load_config

    overrides = list(params.get("overrides") or [])
    if params.get("sources"):
        overrides.append(f"ingest.sources={json.dumps([str(source) for source in params['sources']])}")
    load_config(params.get("config_path") or None, overrides)  # a bad value fails here, naming the key
    return overrides


def report_outputs(tasks: Mapping[str, BaseOperator]) -> list:
    """The output paths (XCom) of the report tasks among ``tasks``: what a snapshot's announcement waits
    for, since a report's quality gate may hold the snapshot back from training."""
    return [tasks[entry.name].output for entry in STAGES if entry.report and entry.name in tasks]


def publish_token_shards(tasks: Mapping[str, BaseOperator]):
    """The task that ends a corpus DAG: announce the snapshot's token shards on the TOKEN_SHARDS Asset
    (the event schedules `pretrain`), after the reports, unless a report's quality gate failed in mode fail:
    then it is skipped, naming the thresholds missed."""
    from airflow.sdk import task

    from operators.assets import TOKEN_SHARDS, announce_token_shards
    from operators.defaults import run_snapshot
    from pipeline.stages import training_input

    @task(task_id="publish_token_shards", outlets=[TOKEN_SHARDS])
    def announce(path: str, report_paths: list[str], params=None, ds=None, outlet_events=None) -> str:
        return announce_token_shards(
            outlet_events,
            path=path,
            snapshot=run_snapshot(params, ds),
            params=params,
            report_paths=report_paths,
        )

    # Airflow passes the upstream tasks' XCom values at run time.
    return announce(tasks[training_input().name].output, report_outputs(tasks))  # type: ignore[arg-type]
