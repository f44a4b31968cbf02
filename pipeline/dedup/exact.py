"""Exact deduplication: one document per hash of the normalised text, the smallest id wins."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

DUPLICATE_REASON = "exact_duplicate"


def mark_exact_duplicates(df: DataFrame, text_col: str = "text", id_col: str = "id") -> DataFrame:
    """Set drop_reason on every kept row whose text hash was already seen under a smaller id."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    with_hash = df.withColumn("content_hash", F.sha2(F.col(text_col), 256))
    # Rows already dropped sort last, so they never shadow a kept copy.
    first_per_hash = Window.partitionBy("content_hash").orderBy(
        F.col("drop_reason").isNotNull(), F.col(id_col)
    )
    ranked = with_hash.withColumn(
        "_rank", F.when(F.col("drop_reason").isNull(), F.row_number().over(first_per_hash))
    )
    return ranked.withColumn(
        "drop_reason",
        F.when(F.col("drop_reason").isNull() & (F.col("_rank") > 1), F.lit(DUPLICATE_REASON)).otherwise(
            F.col("drop_reason")
        ),
    ).drop("_rank")
