"""Connected components of a graph held in a Spark DataFrame: alternating large-star / small-star.

Kiveris et al., "Connected Components in MapReduce and Beyond" (SoCC 2014). Edges are kept as
(``hi``, ``lo``) with hi > lo. Large-star links every neighbour larger than a node to the smallest node
of its neighbourhood; small-star links a node and its smaller neighbours to the smallest of them. Both
keep the components and shrink toward one star per component centred on its smallest node, in
O(log n) rounds. Everything stays distributed: the driver only sees two small counts per round.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)


class ComponentsDidNotConverge(RuntimeError):
    """More rounds than dedup.max_iterations; the graph is unusual enough to look at."""


def _oriented(edges: DataFrame, left: str, right: str) -> DataFrame:
    from pyspark.sql import functions as F

    return (
        edges.where(F.col(left).isNotNull() & F.col(right).isNotNull() & (F.col(left) != F.col(right)))
        .select(F.greatest(left, right).alias("hi"), F.least(left, right).alias("lo"))
        .distinct()
    )


def large_star(edges: DataFrame, partitions: int) -> DataFrame:
    from pyspark.sql import functions as F

    # One shuffle per step: partitioned by node, the dedup, the min and the join need no other.
    both = (
        edges.select(F.col("hi").alias("u"), F.col("lo").alias("v"))
        .unionByName(edges.select(F.col("lo").alias("u"), F.col("hi").alias("v")))
        .repartition(partitions, "u")
        .dropDuplicates(["u", "v"])
    )
    smallest = both.groupBy("u").agg(F.least(F.min("v"), F.col("u")).alias("m"))
    return (
        both.where(F.col("v") > F.col("u"))
        .join(smallest, "u")
        .select(F.col("v").alias("hi"), F.col("m").alias("lo"))
    )


def small_star(edges: DataFrame, partitions: int) -> DataFrame:
    from pyspark.sql import functions as F

    edges = edges.repartition(partitions, "hi").dropDuplicates(["hi", "lo"])
    smallest = edges.groupBy("hi").agg(F.min("lo").alias("m"))
    neighbours = (
        edges.join(smallest, "hi")
        .where(F.col("lo") != F.col("m"))
        .select(F.col("lo").alias("hi"), F.col("m").alias("lo"))
    )
    return neighbours.unionByName(smallest.select("hi", F.col("m").alias("lo")))


def _is_star_forest(edges: DataFrame) -> bool:
    """Every node points to one centre and no centre points anywhere: each component is one star."""
    from pyspark.sql import functions as F

    ends = edges.select(F.col("hi").alias("node"), F.lit(1).alias("out"), F.lit(0).alias("into")).unionByName(
        edges.select(F.col("lo").alias("node"), F.lit(0).alias("out"), F.lit(1).alias("into"))
    )
    offending = ends.groupBy("node").agg(F.sum("out").alias("out"), F.max("into").alias("into"))
    return (
        offending.where((F.col("out") > 1) | ((F.col("out") > 0) & (F.col("into") > 0))).limit(1).count() == 0
    )


def connected_components(
    edges: DataFrame, left: str = "src", right: str = "dst", max_iterations: int = 64
) -> tuple[DataFrame, int]:
    """(``node``, ``root``) for every node with an edge, and the rounds it took.

    The root is the smallest node of the component; roots map to themselves, so a join on ``node`` finds
    the component of any node of the graph.
    """
    from pyspark.sql import functions as F

    partitions = int(edges.sparkSession.conf.get("spark.sql.shuffle.partitions") or 200)
    # The star test below is the first action on each new edge set, so it also fills the lazy checkpoint.
    current = _oriented(edges, left, right).localCheckpoint(eager=False)
    # Links to a bucket's smallest id are often stars already: then no round is needed.
    rounds = 0
    while not _is_star_forest(current):
        if rounds == max_iterations:
            raise ComponentsDidNotConverge(
                f"connected components did not converge in {max_iterations} rounds; raise dedup.max_iterations"
            )
        # localCheckpoint cuts the lineage, which otherwise grows with every round.
        current = (
            small_star(large_star(current, partitions), partitions).distinct().localCheckpoint(eager=False)
        )
        rounds += 1
    log.info("connected components: stars after %d round(s)", rounds)
    roots = current.select(F.col("lo").alias("node"), F.col("lo").alias("root")).distinct()
    leaves = current.select(F.col("hi").alias("node"), F.col("lo").alias("root"))
    return leaves.unionByName(roots), rounds
