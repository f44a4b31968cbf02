"""The tokenize stage: train a BPE on a deterministic sample, then encode every document in Spark.

Output layout::

    tokenizer.json
    train/shard-00000.bin, .idx, ...      Megatron MMIDIDX shards, documents in seeded shuffled order
    validation/shard-00000.bin, .idx, ...
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from pipeline.core.config import PipelineConfig
from pipeline.core.manifest import Manifest
from pipeline.core.spark import spark_schema, spark_session
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.tokenization.bpe import TOKENIZER_FILE, load_tokenizer, train_tokenizer
from pipeline.tokenization.shards import ShardWriter, token_dtype

log = logging.getLogger(__name__)
STAGE = "tokenize"
SPLITS = ("train", "validation")

SHARD_STATS_SCHEMA = pa.schema(
    [("split", pa.string()), ("shard", pa.string()), ("documents", pa.int64()), ("tokens", pa.int64())]
)


@functools.cache
def _cached_tokenizer(path: str):
    """Loaded once per Python worker, not once per batch."""
    return load_tokenizer(path)


def encode_partition(
    batches: Iterator[pa.RecordBatch], tokenizer_path: str, output: str, split: str, eos_token: str
) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    tokenizer = _cached_tokenizer(tokenizer_path)
    eos_id = tokenizer.token_to_id(eos_token)
    shard_name = f"{split}/shard-{TaskContext.get().partitionId():05d}"
    writer = None
    for batch in batches:
        if writer is None:
            writer = ShardWriter(Path(output) / shard_name, token_dtype(tokenizer.get_vocab_size()))
        for encoding in tokenizer.encode_batch(batch.column("text").to_pylist()):
            writer.add_document([*encoding.ids, eos_id])
    if writer is None:
        return
    writer.close()
    yield pa.RecordBatch.from_pylist(
        [{"split": split, "shard": shard_name, "documents": len(writer.lengths), "tokens": writer.tokens}],
        schema=SHARD_STATS_SCHEMA,
    )


def validation_threshold(docs, fraction: float) -> int:
    """Bucket bound for the validation split; on a small corpus it still takes at least one document."""
    from pyspark.sql import functions as F

    threshold = int(fraction * 1_000_000)
    if fraction > 0 and docs.where(F.col("bucket") < threshold).isEmpty():
        smallest = docs.agg(F.min("bucket")).first()[0]
        threshold = 0 if smallest is None else smallest + 1
    return threshold


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    (documents_ref,) = inputs
    seed = config.project.seed
    with StageOutput(output, config, inputs) as out:
        spark = spark_session(config, f"tokenize-{output.corpus}-{output.snapshot}")
        from pyspark.sql import functions as F

        docs = spark.read.parquet(str(documents_ref.path / "documents")).select("id", "text")
        docs = docs.withColumn("bucket", F.pmod(F.xxhash64(F.lit(seed), "id"), F.lit(1_000_000)))
        threshold = validation_threshold(docs, config.tokenize.validation_fraction)
        docs = docs.withColumn(
            "split", F.when(F.col("bucket") < threshold, "validation").otherwise("train")
        ).withColumn("order", F.xxhash64(F.lit(seed + 1), "id"))

        sample = (
            docs.orderBy("order", "id").limit(config.tokenizer.sample_docs).select("text").toLocalIterator()
        )
        tokenizer = train_tokenizer((row.text for row in sample), config.tokenizer)
        tokenizer_path = out.path / TOKENIZER_FILE
        tokenizer.save(str(tokenizer_path))
        log.info("trained a byte-level BPE with %d tokens", tokenizer.get_vocab_size())

        stats = []
        stats_schema = spark_schema(SHARD_STATS_SCHEMA)
        for split in SPLITS:
            (out.path / split).mkdir()
            shuffled = (
                docs.where(F.col("split") == split)
                .repartition(config.tokenize.num_shards, "order")
                .sortWithinPartitions("order", "id")
                .select("text")
            )
            encode = functools.partial(
                encode_partition,
                tokenizer_path=str(tokenizer_path),
                output=str(out.path),
                split=split,
                eos_token=config.tokenizer.eos_token,
            )
            stats += [row.asDict() for row in shuffled.mapInArrow(encode, stats_schema).collect()]

        totals = {
            split: {
                "documents": sum(s["documents"] for s in stats if s["split"] == split),
                "tokens": sum(s["tokens"] for s in stats if s["split"] == split),
            }
            for split in SPLITS
        }
        log.info("tokenized %s", totals)
        return out.commit(
            rows={f"{split}_documents": totals[split]["documents"] for split in SPLITS},
            counters={"tokens": {split: totals[split]["tokens"] for split in SPLITS}},
            extra={
                "vocab_size": tokenizer.get_vocab_size(),
                "eos_token": config.tokenizer.eos_token,
                "shards": sorted(stats, key=lambda s: s["shard"]),
            },
        )
