"""pipeline.core.spark's Python-pass helper: the worker heap is frozen before each task's body runs, and
every stage's Python pass goes through it."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.spark import map_in_arrow, parquet_rows, python_tasks, spark_session
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


@pytest.mark.slow
def test_write_parquet_bytes_depend_on_the_rows_only_and_an_empty_dataset_has_one_form(tmp_path):
    """Random rows written from 1 and from 7 input partitions give the same files; an empty dataset
    written by Spark (a filter that keeps nothing) and one written without a job (known_rows=0) are the
    same bytes with the schema; a count that disagrees with what was written fails the write."""
    import hashlib
    import random

    import pyarrow.parquet as pq

    from pipeline.core.spark import write_parquet

    rng = random.Random(7)
    rows = [(f"{rng.getrandbits(40):010x}", rng.random(), "x" * rng.randrange(50)) for _ in range(500)]
    spark = spark_session(make_config(tmp_path), "test-core-spark")
    df = spark.createDataFrame(rows, "id string, score double, text string")

    def digests(folder):
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.parquet"))}

    assert write_parquet(df.repartition(1), tmp_path / "one", 3) == 500
    assert write_parquet(df.repartition(7), tmp_path / "seven", 3) == 500
    assert digests(tmp_path / "one") == digests(tmp_path / "seven") and len(digests(tmp_path / "one")) == 3
    assert sorted(pq.read_table(tmp_path / "one").column("id").to_pylist()) == sorted(r[0] for r in rows)

    nothing = df.where("score > 2")
    assert write_parquet(nothing, tmp_path / "empty-spark", 3) == 0
    assert write_parquet(nothing, tmp_path / "empty-known", 3, known_rows=0) == 0
    assert digests(tmp_path / "empty-spark") == digests(tmp_path / "empty-known")
    empty = pq.read_table(tmp_path / "empty-known")
    assert empty.num_rows == 0 and empty.schema.names == ["id", "score", "text"]

    with pytest.raises(RuntimeError, match="wrote 500 rows, 499 were counted"):
        write_parquet(df, tmp_path / "miscounted", 3, known_rows=499)


@pytest.mark.slow
def test_write_parquet_parts_writes_what_separate_writes_write_in_fewer_jobs(tmp_path):
    """Random rows (several Arrow batches per file, ties on the key, an expression column, timestamps and a
    struct) split two ways in one job give the bytes of one ``write_parquet`` per part, whose jobs
    ``counted_jobs`` counts; a part known to be empty is written without rows, and a miscount fails."""
    import datetime
    import hashlib
    import random

    from pyspark.sql import functions as F

    from pipeline.core.spark import counted_jobs, write_parquet, write_parquet_parts

    rng = random.Random(11)
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    rows = [
        (
            f"{rng.getrandbits(12):04x}",  # about 4,000 keys for 6,000 rows: many ties
            unique,  # the tiebreak: the same (key, tiebreak) twice would leave the order to the sort
            start + datetime.timedelta(seconds=rng.randrange(10**6)),
            (rng.random(), "y" * rng.randrange(5)),
            rng.choice([None, None, "short", "junk"]),
        )
        for unique in rng.sample(range(10**6), 6000)
    ]
    spark = spark_session(make_config(tmp_path), "test-core-spark")
    df = spark.createDataFrame(
        rows, "id string, n long, at timestamp, detail struct<score: double, tag: string>, reason string"
    ).repartition(5)
    kept = (F.col("reason").isNull(), ["id", "n", "at", "detail"])
    dropped = (F.col("reason").isNotNull(), ["id", "n", (F.col("n") * 2).alias("twice"), "reason"])

    def digests(folder):
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.parquet"))}

    with counted_jobs(spark) as separate:
        expected = [
            write_parquet(df.where(where).select(*columns), tmp_path / f"separate-{name}", 2, tiebreak=("n",))
            for name, (where, columns) in (("kept", kept), ("dropped", dropped))
        ]
    with counted_jobs(spark) as together:
        written = write_parquet_parts(
            df,
            [
                (tmp_path / f"together-{name}", where, columns, None)
                for name, (where, columns) in (("kept", kept), ("dropped", dropped))
            ],
            2,
            tiebreak=("n",),
        )
    assert written == expected and sum(written) == 6000 and min(written) > 2000
    for name in ("kept", "dropped"):
        assert digests(tmp_path / f"together-{name}") == digests(tmp_path / f"separate-{name}"), name
        assert len(digests(tmp_path / f"together-{name}")) == 2
    assert 0 < together.jobs < separate.jobs, (together.jobs, separate.jobs)

    nothing = F.col("n") < 0
    assert write_parquet_parts(
        df, [(tmp_path / "a", kept[0], kept[1], None), (tmp_path / "none", nothing, ["id"], 0)], 2
    ) == [expected[0], 0]
    assert pq.read_table(tmp_path / "none").num_rows == 0
    with pytest.raises(RuntimeError, match=f"wrote {expected[1]} rows, 5 were counted"):
        write_parquet_parts(
            df, [(tmp_path / "b", kept[0], kept[1], None), (tmp_path / "c", dropped[0], dropped[1], 5)], 2
        )


SESSION_SCRIPT = """
import logging, pathlib, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="LOG %(name)s %(message)s")
import pipeline.core.spark as spark
spark.PROGRESS_INTERVAL_S = 0.2
seen = pathlib.Path("progress-seen").resolve()


class Signal(logging.Handler):
    def emit(self, record):
        if "tasks" in record.getMessage():
            seen.touch()


logging.getLogger("pipeline.core.spark").addHandler(Signal())
from pipeline.config import load_config
session = spark.spark_session(load_config(environ={}), "quiet")


def wait_for_the_progress_line(row):
    # Each task runs until the driver has logged a progress line (the signal), or gives up after 5 minutes.
    import pathlib, time
    for _ in range(3000):
        if pathlib.Path(SEEN).exists():
            break
        time.sleep(0.1)
    return row


SEEN = str(seen)
rows = session.range(0, 64, numPartitions=16).rdd.map(wait_for_the_progress_line).count()
print("rows", rows)
session.stop()
"""


@pytest.mark.slow
def test_a_stage_log_gets_progress_lines_and_no_console_bar_or_start_up_notices(tmp_path):
    """Stderr captured (not a terminal), as in an Airflow task log: no `[Stage 0:==>` fragments, none of the
    JVM's start-up notices (incubator modules, loopback hostname, native-hadoop, default log4j profile), and
    the running stage's task counts as log lines instead."""
    import os
    import subprocess
    import sys

    environment = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    environment.pop("SPARK_LOCAL_IP", None)
    done = subprocess.run(
        [sys.executable, "-c", SESSION_SCRIPT],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and "rows 64" in done.stdout, done.stderr[-3000:]
    for noise in ("[Stage", "incubator modules", "loopback address", "NativeCodeLoader", "log4j profile"):
        assert noise not in done.stderr, (noise, done.stderr[-3000:])
    assert re.search(r"LOG pipeline\.core\.spark spark: stage 0 \d+/16 tasks", done.stderr), done.stderr[
        -3000:
    ]


def test_a_spark_error_whose_jvm_died_passes_through_unchanged(tmp_path):
    """A job that ran the JVM out of heap kills it, and the Py4JJavaError's text is then fetched from a JVM
    that refuses the connection. The stage must fail with that error, not with the refused connection."""
    from py4j.protocol import Py4JJavaError

    from pipeline.core.spark import input_read_errors
    from pipeline.core.storage import DatasetRef

    class DeadGateway:
        def send_command(self, command):
            raise ConnectionRefusedError(111, "Connection refused")

    class JavaException:
        _target_id = "o42"
        _gateway_client = DeadGateway()

    died = Py4JJavaError("An error occurred while calling o42.parquet.\n", JavaException())
    config = make_config(tmp_path)
    with pytest.raises(Py4JJavaError) as raised, input_read_errors([DatasetRef.of(config, "dedup", "s1")]):
        raise died
    assert raised.value is died


@settings(max_examples=200)
@given(
    rows=st.integers(0, 10**7),
    partitions=st.integers(1, 512),
    per_task=st.integers(1, 10**5),
)
def test_a_python_pass_gets_the_fewest_tasks_that_hold_at_most_the_minimum_each_up_to_the_partitions(
    tmp_path_factory, rows, partitions, per_task
):
    config = make_config(
        tmp_path_factory.getbasetemp(),
        f"spark.shuffle_partitions={partitions}",
        f"spark.min_rows_per_task={per_task}",
    )
    tasks = python_tasks(rows, config)
    assert 1 <= tasks <= partitions
    if tasks < partitions:  # no more tasks than it takes to hold at most per_task rows each
        assert rows <= tasks * per_task
        assert tasks == 1 or rows > (tasks - 1) * per_task
    else:  # one task fewer would leave some task over the minimum
        assert partitions == 1 or rows > (partitions - 1) * per_task


def test_parquet_rows_counts_every_file_from_its_footer(tmp_path):
    sizes = [0, 1, 37, 1000]
    for index, size in enumerate(sizes):
        pq.write_table(pa.table({"id": list(range(size))}), tmp_path / f"part-{index}.parquet")
    (tmp_path / "_SUCCESS").write_text("")
    assert parquet_rows(tmp_path) == sum(sizes)
