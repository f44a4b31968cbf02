"""The clean stage as a Spark job: WARC pages (or ingested documents) in, kept and excluded documents out.

Steps (datatrove style: each one only marks what it rejects, nothing is deleted):

1. extract main text from the WARC record (``extract.py``, a mapInArrow); an ingest's documents are
   already extracted (``extracted_pages`` chooses by what the input holds);
2. quarantine texts over ``max_chars`` before any Python work (Spark SQL);
3. one mapInArrow pass per batch: repair and normalise the text, identify its language and compute every
   quality signal of the FineWeb recipe (Gopher repetition, Gopher quality, C4, FineWeb) for documents
   in a kept language;
4. decide with Spark SQL: the first rule, in recipe order, whose signal crosses its threshold names the
   drop (``drop_rule``) and explains it (``drop_reason``);
5. redact PII with Spark's built-in regex functions and count each kind;
6. write ``documents/`` and ``excluded/`` (byte-deterministic Parquet) and the manifest counters.

Exact and near-duplicate removal is the dedup stage's job, which reads ``documents/``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from pipeline.clean import pii
from pipeline.clean.config import CleanConfig
from pipeline.clean.filters import SIGNALS, DocumentSignals, c4, recipe_rules
from pipeline.clean.language import identify_language
from pipeline.clean.url_filter import URL_MARKED_FIELDS, UrlFilter, mark_batches
from pipeline.config import PipelineConfig
from pipeline.core.manifest import Manifest
from pipeline.core.spark import (
    file_splits,
    map_in_arrow,
    parquet_rows,
    python_tasks,
    share,
    spark_schema,
    spark_session,
)
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.documents.extract import EXTRACTED_SCHEMA, extract_batches
from pipeline.documents.normalize import decode_utf8, normalize_text
from pipeline.documents.rules import per_language_sql, sql_literal
from pipeline.documents.split import write_split

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
STAGE = "clean"
UNKNOWN_LANGUAGE = "und"

# Input of the Python pass: extracted documents plus the first drop found so far.
MARKED_SCHEMA = pa.schema([*EXTRACTED_SCHEMA, ("drop_rule", pa.string())])
PREPARED_SCHEMA = pa.schema(
    [
        *MARKED_SCHEMA,
        ("lang", pa.string()),
        ("lang_score", pa.float64()),
        ("signals", SIGNALS),
        ("c4_text", pa.string()),
    ]
)
DOCUMENT_COLUMNS = [
    "id",
    "url",
    "domain",
    "fetch_time",
    "text",
    "n_chars",
    "lang",
    "lang_score",
    "signals",
    "pii",
]
EXCLUDED_COLUMNS = [*DOCUMENT_COLUMNS, "drop_rule", "drop_reason"]


def prepare_batches(batches: Iterator[pa.RecordBatch], config: CleanConfig) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: normalise, identify the language and compute the filter signals of each row.

    Rows already marked (extraction failures, oversized texts) pass through untouched but decoded.
    Text arrives as bytes, so invalid UTF-8 (binary junk, encoded surrogates) is replaced, not fatal.
    One failing row is marked ``clean.error`` and never fails the partition.
    """
    documents = DocumentSignals(config)
    kept_languages = set(config.languages)
    for batch in batches:
        raw_texts = batch.column("text").cast(pa.binary()).to_pylist()
        rules = batch.column("drop_rule").to_pylist()
        reasons = batch.column("drop_reason").to_pylist()
        columns: dict[str, list] = {name: [] for name in ("text", "lang", "lang_score", "signals", "c4_text")}
        for row, raw in enumerate(raw_texts):
            text = decode_utf8(raw) if raw is not None else None
            lang: str | None = None
            score: float | None = None
            signals = c4_text = None
            if rules[row] is None and text is not None:
                try:
                    text = normalize_text(text, config.unicode_form)
                    if text:
                        lang, score = identify_language(text, config.langid_max_chars, config.language_groups)
                    if (
                        len(text) >= config.min_chars
                        and lang in kept_languages
                        and score is not None
                        and score >= config.min_score_for(lang)
                    ):
                        signals, c4_text = documents.compute(text, lang)
                except Exception as exc:  # one bad document must not fail the partition
                    rules[row] = "clean.error"
                    reasons[row] = f"{type(exc).__name__}: {exc}"[:500]
                    lang = score = signals = c4_text = None
            columns["text"].append(text)
            columns["lang"].append(lang)
            columns["lang_score"].append(score)
            columns["signals"].append(signals)
            columns["c4_text"].append(c4_text)
        arrays = {name: batch.column(name) for name in MARKED_SCHEMA.names}
        arrays["drop_rule"] = pa.array(rules, pa.string())
        arrays["drop_reason"] = pa.array(reasons, pa.string())
        arrays.update(
            {name: pa.array(values, PREPARED_SCHEMA.field(name).type) for name, values in columns.items()}
        )
        yield pa.RecordBatch.from_arrays(
            [arrays[name] for name in PREPARED_SCHEMA.names], schema=PREPARED_SCHEMA
        )


def _decision_rules(config: CleanConfig) -> list[tuple[str, str, str]]:
    """(rule name, drop condition, reason) for every rule after the Python pass, in recipe order, as Spark
    SQL (``sql_literal`` says why text)."""
    languages = ", ".join(sql_literal(lang) for lang in config.languages)
    min_scores: dict[str | None, float] = {None: config.min_language_score}
    min_scores.update(config.language_min_scores)
    min_score = per_language_sql("lang", min_scores, sql_literal)
    decisions = [
        (
            "normalize.too_short",
            f"text IS NULL OR length(text) < {config.min_chars}",
            "concat('normalize.too_short: n_chars=', CAST(coalesce(length(text), 0) AS STRING), "
            f"{sql_literal(f' < {config.min_chars}')})",
        ),
        (
            "language.not_kept",
            f"NOT coalesce(array_contains(array({languages}), lang), false)",
            f"concat('language.not_kept: lang=', coalesce(lang, {sql_literal(UNKNOWN_LANGUAGE)}), "
            f"{sql_literal(f' not in {sorted(config.languages)}')})",
        ),
        (
            "language.min_score",
            f"lang_score < {min_score}",
            f"concat('language.min_score: lang_score=', CAST(lang_score AS STRING), ' < ', "
            f"CAST({min_score} AS STRING))",
        ),
    ]
    for rule in recipe_rules(config, sorted(config.language_overrides)):
        decisions.append((rule.name, rule.sql_condition(), rule.sql_reason()))
    return decisions


def clean_documents(extracted: DataFrame, config: PipelineConfig) -> DataFrame:
    """Every extracted row, with its final text, language, signals, PII counts and, when dropped, the
    first rule that dropped it (``drop_rule``) and why (``drop_reason``)."""
    from pyspark.sql import functions as F

    clean = config.clean
    # The URL filter's reasons name their own rule (url.domain:adult, ...); the extractor's get "extract.".
    upstream = F.when(
        F.col("drop_reason").startswith("url."),
        F.regexp_extract("drop_reason", r"^url\.[a-z_]+(:[A-Za-z0-9_.-]+)?", 0),
    ).otherwise(F.concat(F.lit("extract."), F.regexp_extract("drop_reason", r"^[a-z_]+", 0)))
    too_long = F.length("text") > clean.max_chars
    marked = extracted.withColumn(
        "drop_rule",
        F.when(F.col("drop_reason").isNotNull(), upstream).when(too_long, F.lit("input.too_long")),
    ).withColumn(
        "drop_reason",
        F.when(F.col("drop_reason").isNotNull(), F.col("drop_reason")).when(
            too_long,
            F.concat(
                F.lit("input.too_long: n_chars="),
                F.length("text").cast("string"),
                F.lit(f" > {clean.max_chars}"),
            ),
        ),
    )
    prepared = map_in_arrow(
        marked.select(*MARKED_SCHEMA.names),
        lambda batches: prepare_batches(batches, clean),
        spark_schema(PREPARED_SCHEMA),
    )

    # The first rule whose condition holds names the drop: a CASE takes the first true WHEN.
    decisions = _decision_rules(clean)
    first_rule = " ".join(f"WHEN {cond} THEN {sql_literal(name)}" for name, cond, _ in decisions)
    first_reason = " ".join(f"WHEN {cond} THEN {reason}" for _, cond, reason in decisions)
    decided = prepared.withColumns(
        {
            "drop_reason": F.expr(f"coalesce(drop_reason, CASE {first_reason} END)"),
            "drop_rule": F.expr(f"coalesce(drop_rule, CASE {first_rule} END)"),
        }
    )

    # Kept documents and FineWeb drops carry C4's text (its line removals), like datatrove's pipeline.
    takes_c4_text = F.col("drop_rule").isNull() | F.col("drop_rule").startswith("fineweb.")
    decided = decided.withColumn(
        "text",
        F.when(takes_c4_text & F.col("c4_text").isNotNull(), F.col("c4_text")).otherwise(F.col("text")),
    ).drop("c4_text")
    if clean.pii.enabled:
        decided = pii.redact_dataframe(decided, pii.placeholders(clean.pii))
    else:
        decided = decided.withColumn("pii", F.struct(*[F.lit(0).alias(kind) for kind in pii.KINDS]))
    decided = decided.withColumn("n_chars", F.length("text"))
    return decided.select(*EXCLUDED_COLUMNS)


def clean_counters(decided: DataFrame) -> dict:
    """Manifest counters from one aggregation: drops per rule and language, PII per kind, C4 line removals."""
    from pyspark.sql import functions as F

    line_removals = [f"lines_{reason}" for reason in c4.LINE_REMOVALS]
    rows = (
        decided.groupBy("drop_rule", "lang")
        .agg(
            F.count(F.lit(1)).alias("documents"),
            F.sum("n_chars").alias("characters"),
            *[F.sum(f"pii.{kind}").alias(f"pii_{kind}") for kind in pii.KINDS],
            *[F.sum(f"signals.c4.{name}").alias(name) for name in line_removals],
        )
        .collect()
    )
    dropped: dict[str, int] = {}
    dropped_chars: dict[str, int] = {}
    kept_chars = 0
    kept_by_language: dict[str, int] = {}
    dropped_by_language: dict[str, int] = {}
    pii_kept = dict.fromkeys(pii.KINDS, 0)
    pii_excluded = dict.fromkeys(pii.KINDS, 0)
    c4_lines_removed = {reason: 0 for reason in c4.LINE_REMOVALS}
    for row in rows:
        lang = row["lang"] or UNKNOWN_LANGUAGE
        count, characters = int(row["documents"]), int(row["characters"] or 0)
        if row["drop_rule"] is None:
            kept_chars += characters
            kept_by_language[lang] = kept_by_language.get(lang, 0) + count
            for kind in pii.KINDS:
                pii_kept[kind] += int(row[f"pii_{kind}"] or 0)
            for reason in c4.LINE_REMOVALS:
                c4_lines_removed[reason] += int(row[f"lines_{reason}"] or 0)
        else:
            dropped[row["drop_rule"]] = dropped.get(row["drop_rule"], 0) + count
            dropped_chars[row["drop_rule"]] = dropped_chars.get(row["drop_rule"], 0) + characters
            dropped_by_language[lang] = dropped_by_language.get(lang, 0) + count
            for kind in pii.KINDS:
                pii_excluded[kind] += int(row[f"pii_{kind}"] or 0)
    kept = sum(kept_by_language.values())
    return {
        "input_pages": kept + sum(dropped.values()),
        "kept": kept,
        "dropped": dict(sorted(dropped.items())),
        # Characters of the documents each rule dropped, and of those kept (after C4's line removals).
        "input_chars": kept_chars + sum(dropped_chars.values()),
        "kept_chars": kept_chars,
        "dropped_chars": dict(sorted(dropped_chars.items())),
        "kept_by_language": dict(sorted(kept_by_language.items())),
        "dropped_by_language": dict(sorted(dropped_by_language.items())),
        "pii_redacted": pii_kept,
        "pii_redacted_excluded": pii_excluded,
        "c4_lines_removed": c4_lines_removed,
    }


def write_outputs(decided: DataFrame, path, num_files: int, counters: dict | None = None) -> None:
    """documents/ and excluded/; with ``clean_counters``' counts, an empty one is written without a job."""
    write_split(
        decided,
        path,
        num_files,
        reason="drop_rule",
        document_columns=DOCUMENT_COLUMNS,
        kept_rows=counters["kept"] if counters else None,
        excluded_rows=counters["input_pages"] - counters["kept"] if counters else None,
    )


def url_marked(documents: DataFrame, url_filter) -> DataFrame:
    """Documents already extracted (an ingest's), with the URL filter's reason where they had none."""
    from pyspark.sql import functions as F

    marked = map_in_arrow(
        documents,
        lambda batches: mark_batches(batches, url_filter),
        spark_schema(pa.schema([*EXTRACTED_SCHEMA, *URL_MARKED_FIELDS])),
    )
    return marked.withColumn("drop_reason", F.coalesce("drop_reason", "url_reason")).select(
        *EXTRACTED_SCHEMA.names
    )


def extracted_pages(
    spark: SparkSession, source: DatasetRef, config: PipelineConfig, url_filter=None
) -> DataFrame:
    """The input's documents in EXTRACTED_SCHEMA, by what the input holds.

    A crawl (a fetch ``index/`` pointing into WARC files) is extracted here; an ingest already holds
    ``documents/`` in EXTRACTED_SCHEMA (pipeline.ingest), which are read as they are. ``url_filter`` (a
    shared UrlFilter) marks blocked URLs first; a crawl's blocked pages are never read or extracted.
    """
    from pyspark.sql import functions as F

    if not (source.path / "index").is_dir() and (source.path / "documents").is_dir():
        documents = spark.read.parquet(str(source.path / "documents")).select(*EXTRACTED_SCHEMA.names)
        # Spread the rows over the cores only when the files give too few tasks: shuffling a large corpus
        # costs more than it balances.
        tasks = python_tasks(parquet_rows(source.path / "documents"), config)
        if file_splits(source.path / "documents") < tasks:
            documents = documents.repartition(tasks, "id")
        return documents if url_filter is None else url_marked(documents, url_filter)
    index = spark.read.parquet(str(source.path / "index"))
    pages = index.where(F.col("status") == 200).withColumn("id", F.substring(F.sha1("url"), 1, 16))
    # The fetch index is a few small files; spread its rows so extraction and filtering use every core.
    pages = pages.repartition(python_tasks(parquet_rows(source.path / "index"), config), "id")
    crawl_root = str(source.path)
    return map_in_arrow(
        pages.select("id", "url", "domain", "fetch_time", "warc_file", "warc_offset", "content_type"),
        lambda batches: extract_batches(batches, crawl_root, url_filter),
        spark_schema(EXTRACTED_SCHEMA),
    )


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    (source,) = inputs  # a crawl, or an ingest (`--input-stage ingest`)
    with StageOutput(output, config, inputs) as out:
        spark = spark_session(config, f"clean-{output.corpus}-{output.snapshot}")
        url_filter = UrlFilter.from_config(config.clean.url_filter)
        shared = share(spark, url_filter) if url_filter is not None else None
        extracted = extracted_pages(spark, source, config, shared)
        decided = clean_documents(extracted, config).cache()
        try:
            counters = clean_counters(decided)
            write_outputs(decided, out.path, config.spark.output_files, counters)
        finally:
            decided.unpersist()
        log.info(
            "clean: kept %d of %d documents; dropped %s; PII redacted %s",
            counters["kept"],
            counters["input_pages"],
            counters["dropped"] or "none",
            counters["pii_redacted"],
        )
        return out.commit(
            rows={"documents": counters["kept"], "excluded": counters["input_pages"] - counters["kept"]},
            counters=counters,
            extra={"url_filter": url_filter.sizes} if url_filter is not None else None,
        )
