"""The clean stage as a Spark job: WARC pages in, kept and excluded documents out.

Steps, each of which only sets ``drop_reason`` on the rows it rejects (datatrove style):
extract main text -> normalise -> length filter -> exact dedup. Rows are split into
``documents/`` and ``excluded/`` at the end, so every drop is kept with its reason.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pyarrow as pa

from pipeline.clean.extract import EXTRACTED_SCHEMA, extract_batches
from pipeline.clean.normalize import normalize_text
from pipeline.core.config import PipelineConfig
from pipeline.core.manifest import Manifest
from pipeline.core.spark import count_by, spark_schema, spark_session, write_parquet
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.dedup.exact import mark_exact_duplicates

log = logging.getLogger(__name__)
STAGE = "clean"


def normalize_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        texts = batch.column("text").to_pylist()
        normalized = [normalize_text(text) if text is not None else None for text in texts]
        index = batch.schema.get_field_index("text")
        yield batch.set_column(index, "text", pa.array(normalized, pa.string()))


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    (crawl,) = inputs
    with StageOutput(output, config, inputs) as out:
        spark = spark_session(config, f"clean-{output.corpus}-{output.snapshot}")
        from pyspark.sql import functions as F

        index = spark.read.parquet(str(crawl.path / "index"))
        pages = index.where(F.col("status") == 200).withColumn("id", F.substring(F.sha1("url"), 1, 16))
        crawl_root = str(crawl.path)
        schema = spark_schema(EXTRACTED_SCHEMA)
        extracted = pages.select(
            "id", "url", "domain", "fetch_time", "warc_file", "warc_offset", "content_type"
        ).mapInArrow(lambda batches: extract_batches(batches, crawl_root), schema)
        normalized = extracted.mapInArrow(normalize_batches, schema)
        length = F.length("text")
        filtered = normalized.withColumn(
            "drop_reason",
            F.when(F.col("drop_reason").isNotNull(), F.col("drop_reason"))
            .when(length < config.clean.min_chars, F.lit("too_short"))
            .when(length > config.clean.max_chars, F.lit("too_long")),
        )
        decided = mark_exact_duplicates(filtered).withColumn("n_chars", length).cache()

        documents = decided.where(F.col("drop_reason").isNull()).drop("drop_reason")
        excluded = decided.where(F.col("drop_reason").isNotNull())
        write_parquet(documents, out.path / "documents", config.spark.output_files)
        write_parquet(excluded, out.path / "excluded", config.spark.output_files)

        reasons = count_by(decided.fillna({"drop_reason": "kept"}), "drop_reason")
        kept = reasons.pop("kept", 0)
        decided.unpersist()
        log.info("clean: kept %d documents, dropped %s", kept, reasons or "none")
        return out.commit(
            rows={"documents": kept, "excluded": sum(reasons.values())},
            counters={"input_pages": kept + sum(reasons.values()), "kept": kept, "dropped": reasons},
        )
