"""pipeline.core.spark's Python-pass helper: the worker heap is frozen before each task's body runs, and
every stage's Python pass goes through it."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from pipeline.core.spark import map_in_arrow, spark_session
from tests.conftest import PROJECT_ROOT, make_config


@pytest.mark.slow
def test_a_python_pass_runs_with_the_workers_long_lived_objects_frozen(tmp_path):
    """gc.get_freeze_count() inside the body: above zero, so the daemon's gc.collect() after each task
    skips the modules and models the worker holds. The rows pass through unchanged."""

    def body(batches):
        import gc

        for batch in batches:
            yield pa.RecordBatch.from_pydict(
                {"id": batch.column("id"), "frozen": [gc.get_freeze_count()] * batch.num_rows}
            )

    spark = spark_session(make_config(tmp_path), "test-core-spark")
    rows = map_in_arrow(spark.range(40).repartition(4), body, "id long, frozen long").collect()
    assert sorted(row["id"] for row in rows) == list(range(40))
    assert min(row["frozen"] for row in rows) > 0


def test_every_python_pass_in_the_stages_goes_through_map_in_arrow():
    direct = [
        f"{path.relative_to(PROJECT_ROOT)}:{number}"
        for folder in ("pipeline", "operators")
        for path in sorted((PROJECT_ROOT / folder).rglob("*.py"))
        if path != PROJECT_ROOT / "pipeline" / "core" / "spark.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\.mapInArrow\(", line)
    ]
    assert not direct, f"call pipeline.core.spark.map_in_arrow instead: {direct}"
