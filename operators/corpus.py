"""The corpus stages after the crawl, as tasks: the one place that says which stages a corpus goes through.

`corpus_ingest` (daily, after a crawl), `reprocess_corpus` (backfills over stored crawls) and the demo
`pretrain_pipeline` build their stage tasks here, so a new stage joins all of them with a one-line change.
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow.sdk import BaseOperator

from operators.spark import PipelineSparkSubmitOperator
from operators.stage import PipelineStageOperator
from pipeline.core.config import PipelineConfig

# Each stage reads the output of the one before it (`--input-stage`); the last one writes the token shards.
CORPUS_STAGES: tuple[str, ...] = ("clean", "dedup", "tokenize")

# Reports on the finished documents (the output of the stage before the last), run beside tokenization
# by corpus_ingest. Backfills (reprocess_corpus) re-make the data, not the reports.
CORPUS_REPORTS: tuple[str, ...] = ("quality",)

# Stages that are Spark applications, submitted with spark-submit; any other runs as `pretrain <stage>`.
SPARK_STAGES = frozenset({"clean", "dedup", "tokenize", "quality"})


def crawl_shard_ids(config: PipelineConfig) -> list[int]:
    """One mapped crawl task per id: ``range(crawl.num_shards)``, split by registered domain."""
    from pipeline.crawl.sharding import shard_ids

    return shard_ids(config)


def stage_task(stage: str, input_stage: str, **kwargs) -> BaseOperator:
    if stage in SPARK_STAGES:
        return PipelineSparkSubmitOperator(stage=stage, input_stage=input_stage, **kwargs)
    return PipelineStageOperator(stage=stage, extra_args=["--input-stage", input_stage], **kwargs)


def corpus_stage_tasks(
    first_input: str = "crawl",
    stages: Sequence[str] = CORPUS_STAGES,
    reports: Sequence[str] = (),
) -> list[BaseOperator]:
    """Create the stage tasks in the DAG being defined, chained in order; returns them, last = token shards."""
    tasks: list[BaseOperator] = []
    previous = first_input
    for stage in stages:
        task = stage_task(stage, previous)
        if tasks:
            tasks[-1] >> task
        tasks.append(task)
        previous = stage
    documents_stage = stages[-2] if len(stages) > 1 else first_input
    for report in reports:
        task = stage_task(report, documents_stage)
        if len(tasks) > 1:
            tasks[-2] >> task
    return tasks
