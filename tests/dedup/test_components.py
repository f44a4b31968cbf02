"""Large-star / small-star connected components in Spark against union-find."""

from __future__ import annotations

import random
from itertools import pairwise

import pytest

from pipeline.core.spark import spark_session
from pipeline.dedup.components import ComponentsDidNotConverge, connected_components
from tests.dedup.reference import UnionFind


def random_graphs(seed: int) -> list[tuple[str, str]]:
    """Many graphs in one edge list, each in its own id range: sparse, dense, paths, stars, cycles."""
    rng = random.Random(seed)
    edges = []
    for graph in range(30):
        prefix = f"g{graph:02d}-"
        nodes = [f"{prefix}{rng.getrandbits(40):010x}" for _ in range(rng.randint(2, 40))]
        shape = graph % 5
        if shape == 0:  # sparse random
            edges += [(rng.choice(nodes), rng.choice(nodes)) for _ in range(len(nodes))]
        elif shape == 1:  # long path in random order: many rounds for naive label propagation
            edges += list(pairwise(nodes))
        elif shape == 2:  # star centred on the largest id
            centre = max(nodes)
            edges += [(centre, node) for node in nodes if node != centre]
        elif shape == 3:  # cycle plus chords
            edges += list(zip(nodes, nodes[1:] + nodes[:1], strict=True))
            edges += [(rng.choice(nodes), rng.choice(nodes)) for _ in range(3)]
        else:  # dense
            edges += [(a, b) for a in nodes for b in nodes if rng.random() < 0.3]
    return edges


def reference_components(edges):
    union = UnionFind()
    for a, b in edges:
        if a != b:
            union.union(a, b)
    return union.components()


@pytest.mark.slow
def test_components_match_union_find(config):
    spark = spark_session(config, "dedup-components-test")
    edges = random_graphs(seed=17)
    frame = spark.createDataFrame(edges, "src string, dst string")
    roots, rounds = connected_components(frame, "src", "dst")
    got = {row["node"]: row["root"] for row in roots.collect()}
    assert got == reference_components(edges)
    assert rounds >= 1


@pytest.mark.slow
def test_components_stop_with_a_clear_error_when_rounds_run_out(config):
    spark = spark_session(config, "dedup-components-test")
    path = [f"n{i:03d}" for i in range(64)]
    random.Random(3).shuffle(path)
    frame = spark.createDataFrame(list(pairwise(path)), "src string, dst string")
    with pytest.raises(ComponentsDidNotConverge, match="max_iterations"):
        connected_components(frame, "src", "dst", max_iterations=1)
    empty, rounds = connected_components(spark.createDataFrame([], "src string, dst string"))
    assert empty.count() == 0 and rounds == 0
