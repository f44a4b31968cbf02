"""Which scored documents a model keeps: a threshold, or an exact top fraction found with one global quantile.

Threshold mode keeps exactly the documents scoring at or above the threshold (``keep: low``: at or below),
per language where ``language_thresholds`` names one. Top-fraction mode keeps ``k = round(fraction * n)`` of
the ``n`` documents the model scored, best first, ties broken by id, so the share kept is within half a
document of the one asked for. The cut is found without sorting the corpus: Spark's approximate quantile
brackets it, the distinct scores inside the bracket come to the driver with their counts, and the last kept
document's id is found among those tied on the cut's score (in the driver for a small block, in Spark for a
large one); the cut (that score and id) is recorded in the manifest. Unscored documents (languages the model does
not cover) always pass.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.classify.config import ScoringModel
from pipeline.documents.rules import per_language_sql, sql_literal

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class Cut:
    """A model's selection, as decided for this snapshot."""

    mode: str  # threshold | top_fraction | none
    keep: str = "high"
    threshold: float | None = None  # top_fraction: the score of the last document kept
    language_thresholds: dict[str, float] = field(default_factory=dict)
    top_fraction: float | None = None
    # top_fraction: of documents scoring exactly `threshold`, ids up to this one stay
    tie_id: str | None = None
    scored: int | None = None  # top_fraction: documents scored (n)
    target: int | None = None  # top_fraction: documents to keep (k)

    def record(self) -> dict[str, Any]:
        return asdict(self)


def keep_condition(column: str, cut: Cut) -> str:
    """Spark SQL that is true for a document the model keeps (and for every unscored one)."""
    if cut.mode == "none":
        return "true"
    better = ">" if cut.keep == "high" else "<"
    if cut.mode == "top_fraction":
        if cut.target == 0:
            return f"{column} IS NULL"
        if cut.tie_id is None or cut.threshold is None:  # everything scored is kept
            return "true"
        value = sql_literal(float(cut.threshold))
        return (
            f"({column} IS NULL OR {column} {better} {value} OR "
            f"({column} = {value} AND id <= {sql_literal(cut.tie_id)}))"
        )
    thresholds: dict[str | None, float | None] = {
        None: cut.threshold,
        **dict(sorted(cut.language_thresholds.items())),
    }
    bound = per_language_sql(
        "lang", {lang: _double(value) for lang, value in thresholds.items()}, sql_literal
    )
    # A language with no threshold at all (no default, not in language_thresholds) is not selected on.
    return f"({column} IS NULL OR ({bound}) IS NULL OR {column} {better}= ({bound}))"


def _double(value: float | None) -> float | None:
    return None if value is None else float(value)


def drop_reason_sql(models: list[tuple[ScoringModel, Cut]]) -> str:
    """The first model, in config order, that drops the document names the reason; NULL when all keep it."""
    whens = " ".join(
        f"WHEN NOT {keep_condition(spec.column, cut)} THEN {sql_literal(spec.reason)}" for spec, cut in models
    )
    return f"CASE {whens} END" if whens else "CAST(NULL AS STRING)"


def top_fraction_cut(scored: DataFrame, column: str, fraction: float, keep: str, error: float) -> Cut:
    """The exact cut keeping round(fraction * n) of the n scored documents, best first, ties to smaller ids."""
    from pyspark.sql import functions as F

    sign = 1.0 if keep == "high" else -1.0
    ranked = scored.where(F.col(column).isNotNull()).select("id", (F.col(column) * sign).alias("key"))
    n = ranked.count()
    k = math.floor(fraction * n + 0.5)
    base = functools.partial(Cut, mode="top_fraction", keep=keep, top_fraction=fraction, scored=n, target=k)
    if k == 0 or k == n:
        return base()
    position = 1.0 - k / n  # the cut's key sits at this quantile from the bottom
    width = 2 * error
    while True:
        low_p, high_p = max(0.0, position - width), min(1.0, position + width)
        low, high = ranked.approxQuantile("key", [low_p, high_p], error)
        if low_p == 0.0:
            low = -math.inf
        if high_p == 1.0:
            high = math.inf
        above = ranked.where(F.col("key") > high).count() if math.isfinite(high) else 0
        inside = ranked.where((F.col("key") >= low) & (F.col("key") <= high))
        needed = k - above
        if needed >= 1:
            # One row per distinct score: a block of documents tied on one score (identical texts) comes to
            # the driver as a count, however large it is.
            counts = inside.groupBy("key").count().orderBy(F.desc("key")).collect()
            for row in counts:
                if needed <= row["count"]:
                    key = row["key"]
                    return base(threshold=key * sign, tie_id=nth_smallest_id(inside, key, needed))
                needed -= row["count"]
        # The approximate quantile missed its guarantee (it cannot for a correct Spark): widen and retry.
        width *= 4


MAX_TIE_IDS_COLLECTED = 100_000


def nth_smallest_id(ranked: DataFrame, key: float, n: int) -> str:
    """The n-th smallest id (1-based) among the documents whose key is ``key``: their ids sorted in the driver
    when there are at most ``MAX_TIE_IDS_COLLECTED`` of them, else ranked in Spark (a sort that spills to
    disk), so the driver never holds a tie block."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ties = ranked.where(F.col("key") == key).select("id")
    few = ties.limit(MAX_TIE_IDS_COLLECTED + 1).collect()
    if len(few) <= MAX_TIE_IDS_COLLECTED:
        return sorted(row["id"] for row in few)[n - 1]
    numbered = ties.select("id", F.row_number().over(Window.orderBy("id")).alias("rank"))
    found = numbered.where(F.col("rank") == n).first()
    assert found is not None  # n is at most the block's size
    return found["id"]
