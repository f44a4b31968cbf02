"""`pretrain crawl` as a task: the whole crawl of a snapshot, one shard of it, or the merge of its shards."""

from __future__ import annotations

from typing import Any

from operators.stage import PipelineStageOperator
from pipeline.config import PipelineConfig
from pipeline.core.storage import DatasetRef


class CrawlOperator(PipelineStageOperator):
    """Crawl one snapshot (or shard ``shard`` of it, or merge its shards) and return the folder published.

    `corpus_crawl` maps one task per shard id (``CrawlOperator.partial(...).expand(shard=ids)``), each
    publishing ``crawl-shards/<snapshot>.shard-I-of-N/``, then one ``merge=True`` task publishes
    ``crawl/<snapshot>/``. Every task reads N from the same config (``crawl.num_shards``). A retried shard
    task resumes its shard's crawl.
    """

    template_fields = (*PipelineStageOperator.template_fields, "shard")

    def __init__(self, *, shard: int | str | None = None, merge: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("task_id", "crawl")
        super().__init__(stage="crawl", **kwargs)
        if shard is not None and merge:
            raise ValueError("a crawl task either crawls one shard or merges them, not both")
        self.shard = shard
        self.merge = merge

    def stage_arguments(self, config: PipelineConfig) -> list[str]:
        shards = ["--num-shards", str(config.crawl.num_shards)]
        if self.shard is not None:
            return ["--shard", str(int(self.shard)), *shards, *self.extra_args]
        if self.merge:
            return ["--merge", *shards, *self.extra_args]
        return list(self.extra_args)

    def output_ref(self, config: PipelineConfig) -> DatasetRef:
        if self.shard is not None:
            from pipeline.crawl.sharding import shard_ref

            return shard_ref(config, self.task_snapshot, int(self.shard))
        return super().output_ref(config)
