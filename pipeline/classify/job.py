"""The classify stage: a score column per configured model for every document, then selection.

Steps (datatrove style: score, decide, count, split):

1. ``models``  find each configured model (a fastText ``.bin`` by path, an embedding classifier, or a
               `train_classifier` output by name), check its label and record its SHA-256 (``models``);
2. ``score``   one mapInArrow pass adds ``score_<name>`` per model; each Python worker loads a model once and
               reuses it for every later task (counted: ``model_loads``); documents in a language a model
               does not cover get null there and pass it (counted per language);
3. ``select``  per model a threshold (per language if configured) or an exact top fraction from one global
               quantile (``selection``); the first model that rejects a document names its drop reason,
               ``classifier:<name>``;
4. ``split``   kept documents (with their scores) to ``documents/``, dropped ones with their scores and
               reason to ``excluded/``; histograms of the scores per model and language, with the cut, to
               the manifest and ``plots/``, where the quality report picks them up.

With no model configured, the stage writes its input's documents unchanged (``passthrough``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pipeline.classify.config import ClassifyConfig, ScoringModel
from pipeline.classify.models import ResolvedModel, loads_column, resolve, score_batches, scored_schema
from pipeline.classify.selection import Cut, drop_reason_sql, top_fraction_cut
from pipeline.config import PipelineConfig
from pipeline.core.manifest import Manifest
from pipeline.core.spark import map_in_arrow, spark_schema, spark_session
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.documents.passthrough import pass_through
from pipeline.documents.plots import plot_scores
from pipeline.documents.split import write_split

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)
STAGE = "classify"
UNKNOWN_LANGUAGE = "und"


class ClassifyInputError(ValueError):
    """The input documents cannot be classified as they are (missing or clashing columns)."""


def check_input(columns: list[str], models: list[ScoringModel]) -> None:
    missing = [name for name in ("id", "text") if name not in columns]
    if missing:
        raise ClassifyInputError(f"input documents lack column(s) {missing}; found {columns}")
    clashing = [name for name in ("drop_reason", *(model.column for model in models)) if name in columns]
    if clashing:
        raise ClassifyInputError(
            f"input documents already have column(s) {clashing}: pass documents that were not classified "
            "with these model names"
        )
    if "lang" not in columns and any(model.languages or model.language_thresholds for model in models):
        raise ClassifyInputError("models name languages, but the input documents have no lang column")


def cut_for(spec: ScoringModel, scored: DataFrame, classify: ClassifyConfig) -> Cut:
    if spec.top_fraction is not None:
        return top_fraction_cut(scored, spec.column, spec.top_fraction, spec.keep, classify.quantile_error)
    if spec.selects:
        return Cut(
            mode="threshold",
            keep=spec.keep,
            threshold=spec.threshold,
            language_thresholds=dict(spec.language_thresholds),
        )
    return Cut(mode="none", keep=spec.keep)


def histograms(decided: DataFrame, spec: ScoringModel, bins: int) -> dict[str, Any]:
    """Per language: documents scored per bin of [0, 1] (all of them, kept or dropped), and documents the
    model passed through unscored."""
    from pyspark.sql import functions as F

    lang = (
        F.coalesce(F.col("lang"), F.lit(UNKNOWN_LANGUAGE))
        if "lang" in decided.columns
        else F.lit(UNKNOWN_LANGUAGE)
    )
    score = F.col(spec.column)
    # greatest/least skip nulls, so an unscored document must stay null explicitly.
    bin_of = F.when(
        score.isNotNull(), F.least(F.greatest(F.floor(score * bins).cast("int"), F.lit(0)), F.lit(bins - 1))
    )
    rows = decided.groupBy(lang.alias("lang"), bin_of.alias("bin")).count().collect()
    counts: dict[str, list[int]] = {}
    passed: dict[str, int] = {}
    for row in rows:
        if row["bin"] is None:
            passed[row["lang"]] = passed.get(row["lang"], 0) + int(row["count"])
        else:
            counts.setdefault(row["lang"], [0] * bins)[row["bin"]] += int(row["count"])
    return {
        "bins": bins,
        "histogram": dict(sorted(counts.items())),
        "passed_through": dict(sorted(passed.items())),
    }


def summary(decided: DataFrame, models: tuple[str, ...] = ()) -> dict[str, Any]:
    """Documents and characters kept and dropped per reason, and per language, and the loads of each of
    ``models`` in the workers (``model_loads``): one aggregation."""
    from pyspark.sql import functions as F

    lang = (
        F.coalesce(F.col("lang"), F.lit(UNKNOWN_LANGUAGE))
        if "lang" in decided.columns
        else F.lit(UNKNOWN_LANGUAGE)
    )
    rows = (
        decided.groupBy("drop_reason", lang.alias("lang"))
        .agg(
            F.count(F.lit(1)).alias("documents"),
            F.sum(F.length("text")).alias("chars"),
            *(F.sum(loads_column(name)).alias(loads_column(name)) for name in models),
        )
        .collect()
    )
    model_loads = {name: sum(int(row[loads_column(name)] or 0) for row in rows) for name in models}
    dropped: dict[str, int] = {}
    dropped_chars: dict[str, int] = {}
    kept = kept_chars = 0
    kept_by_language: dict[str, int] = {}
    dropped_by_language: dict[str, int] = {}
    for row in rows:
        count, chars = int(row["documents"]), int(row["chars"] or 0)
        if row["drop_reason"] is None:
            kept += count
            kept_chars += chars
            kept_by_language[row["lang"]] = kept_by_language.get(row["lang"], 0) + count
        else:
            dropped[row["drop_reason"]] = dropped.get(row["drop_reason"], 0) + count
            dropped_chars[row["drop_reason"]] = dropped_chars.get(row["drop_reason"], 0) + chars
            dropped_by_language[row["lang"]] = dropped_by_language.get(row["lang"], 0) + count
    return {
        "input_documents": kept + sum(dropped.values()),
        "kept": kept,
        "dropped": dict(sorted(dropped.items())),
        "input_chars": kept_chars + sum(dropped_chars.values()),
        "kept_chars": kept_chars,
        "dropped_chars": dict(sorted(dropped_chars.items())),
        "kept_by_language": dict(sorted(kept_by_language.items())),
        "dropped_by_language": dict(sorted(dropped_by_language.items())),
        **({"model_loads": model_loads} if models else {}),
    }


def score(docs: DataFrame, models: list[ResolvedModel]) -> DataFrame:
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = scored_schema(to_arrow_schema(docs.schema, timezone="UTC"), models, with_loads=True)
    return map_in_arrow(docs, lambda batches: score_batches(batches, models), spark_schema(arrow))


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    (source,) = inputs
    classify = config.classify
    with StageOutput(output, config, inputs) as out:
        if not classify.models:
            rows, counters = pass_through(source, out.path)
            log.info(
                "classify: no model configured (classify.models): %d documents passed through",
                rows["documents"],
            )
            return out.commit(rows=rows, counters=counters, extra={"classify": {"models": {}}})
        resolved = [resolve(spec, config) for spec in classify.models]
        for model in resolved:
            log.info(
                "classify: model %s (%s, %s) sha256 %s",
                model.name,
                model.kind,
                model.source,
                model.sha256[:16],
            )
        spark = spark_session(config, f"classify-{output.corpus}-{output.snapshot}")
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        docs = spark.read.parquet(str(source.path / "documents"))
        check_input(docs.columns, classify.models)
        # Deserialized, as DataFrame.cache() keeps it: at 1M documents (partitions of ~190k) the serialized
        # level ran the JVM out of heap building its in-memory bytes instead of spilling to disk.
        scored = score(docs, resolved).persist(StorageLevel.MEMORY_AND_DISK_DESER)
        try:
            cuts = [(spec, cut_for(spec, scored, classify)) for spec in classify.models]
            loads = tuple(model.name for model in resolved)
            decided = scored.withColumn("drop_reason", F.expr(drop_reason_sql(cuts)))
            counters = summary(decided, loads)
            decided = decided.drop(*(loads_column(name) for name in loads))
            views = {spec.name: histograms(decided, spec, classify.histogram_bins) for spec, _ in cuts}
            files = config.spark.output_files
            kept, excluded = write_split(
                decided,
                out.path,
                files,
                kept_rows=counters["kept"],
                excluded_rows=counters["input_documents"] - counters["kept"],
            )
        finally:
            scored.unpersist()
        plots = out.path / "plots"
        plots.mkdir()
        record: dict[str, Any] = {}
        passed_through: dict[str, dict[str, int]] = {}
        for (spec, cut), model in zip(cuts, resolved, strict=True):
            view = views[spec.name]
            passed_through[spec.name] = view["passed_through"]
            record[spec.name] = {
                **model.record(),
                "column": spec.column,
                "reason": spec.reason,
                "cut": cut.record(),
                "model_loads": counters["model_loads"][spec.name],
                "dropped": counters["dropped"].get(spec.reason, 0),
                **view,
            }
            plot_scores(spec.name, record[spec.name], plots / f"scores_{spec.name}.png")
            log.info(
                "classify: %s %s, dropped %d (loaded %d time(s) in the workers)",
                spec.name,
                cut.record(),
                record[spec.name]["dropped"],
                record[spec.name]["model_loads"],
            )
        counters["passed_through"] = passed_through
        counters["model_loads"] = {name: view["model_loads"] for name, view in record.items()}
        log.info(
            "classify: kept %d of %d documents; dropped %s",
            kept,
            counters["input_documents"],
            counters["dropped"] or "none",
        )
        return out.commit(
            rows={"documents": kept, "excluded": excluded},
            counters=counters,
            extra={"classify": {"models": record}},
        )
