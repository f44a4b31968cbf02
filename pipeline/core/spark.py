"""One way to get a SparkSession and one way to write a dataset, for every Spark stage.

A session started here logs like the rest of the pipeline: the JVM's warnings and errors on stderr without its
start-up notices (``log4j2.properties`` beside this module, package data), and, when stderr is not a terminal
(a task log, a file), no console progress bar: the running stages' task counts come as log lines instead.

**A warm server.** When a Spark Connect URL is configured, the session attaches to that server instead of
starting a JVM (about 2 s instead of 5-8). The rule: ``spark.remote`` (``sc://host:port``) when set, else
pyspark's own ``SPARK_REMOTE`` environment variable; both set to different URLs is an error. A configured
remote wins over ``spark.master`` and over spark-submit's master (the stage then only uses the server). The
server runs its own JVM: its log level and progress are its own (``pretrain spark-server``,
``pipeline.core.spark_connect``). Spark Connect has no SparkContext, so the stages use no accumulators,
broadcasts or RDDs: counters are columns summed in a pass the stage runs anyway, and a large read-only
value reaches the workers as a file (``share``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.config import ConfigError, CoreConfig
from pipeline.core.manifest import DamagedInputError

if TYPE_CHECKING:
    from pipeline.core.storage import DatasetRef

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row, SparkSession

# A path in a Spark or Hadoop message: "file:/x/y.parquet", "file:///x/y.parquet" or "/x/y.parquet".
_PATH_IN_MESSAGE = re.compile(r"(?:file:(?://)?)?(/[^\s'\",;\]\[()]+)")

log = logging.getLogger(__name__)


def launched_by_spark_submit() -> bool:
    """spark-submit starts the Python driver with a gateway port; then it, not our config, owns the master."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


# Lines the JVM prints at start that tell a stage's reader nothing (Spark adds the module to every JVM).
JVM_NOISE = (b"WARNING: Using incubator modules: jdk.incubator.vector",)
PROGRESS_INTERVAL_S = 15.0


def remote_url(config: CoreConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """The Spark Connect server to attach to: ``spark.remote``, else ``$SPARK_REMOTE``; None for a local JVM."""
    environ = os.environ if environ is None else environ
    configured, inherited = config.spark.remote, environ.get("SPARK_REMOTE") or None
    if configured and inherited and configured != inherited:
        raise ConfigError(
            f"spark.remote is {configured} but the environment's SPARK_REMOTE is {inherited}: set one of them"
        )
    return configured or inherited


def session_settings(terminal: bool, config: CoreConfig) -> dict[str, str]:
    """The Spark settings every stage runs with (a Connect server starts with them too)."""
    settings = {
        "spark.ui.showConsoleProgress": "true" if terminal else "false",
        "spark.sql.shuffle.partitions": str(config.spark.shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "1000",
        "spark.python.worker.reuse": "true",
        # Our own _SUCCESS marks a whole stage; Hadoop's per-dataset marker is noise.
        "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
        "spark.sql.parquet.compression.codec": "zstd",
    }
    settings.update(config.spark.extra_conf)
    return settings


def is_connect(session: SparkSession) -> bool:
    """Whether ``session`` is a Spark Connect client (no SparkContext, no RDDs)."""
    return type(session).__module__.startswith("pyspark.sql.connect")


def spark_session(config: CoreConfig, app_name: str) -> SparkSession:
    # Workers must run this interpreter, or they miss pyarrow and our package.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    remote = remote_url(config)
    if remote is not None:
        return connect_session(config, app_name, remote)
    from pyspark.sql import SparkSession

    terminal = sys.stderr.isatty()
    builder = SparkSession.builder.appName(app_name)
    java_options = [f"-Dlog4j2.configurationFile={resources.files('pipeline.core') / 'log4j2.properties'}"]
    if not launched_by_spark_submit():
        # The driver binds 127.0.0.1: say so, instead of Spark warning that the hostname is a loopback address.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (
            builder.master(config.spark.master)
            .config("spark.driver.memory", config.spark.driver_memory)
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
        )
    settings = session_settings(terminal, config)
    settings["spark.driver.extraJavaOptions"] = " ".join(
        [*java_options, settings.get("spark.driver.extraJavaOptions", "")]
    ).strip()
    for key, value in settings.items():
        builder = builder.config(key, value)
    with contextlib.nullcontext() if terminal else stderr_without(JVM_NOISE):
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    if not terminal:
        log_progress(session.sparkContext)
    return session


def connect_session(config: CoreConfig, app_name: str, remote: str) -> SparkSession:
    """A Spark Connect session on ``remote``. The server owns the JVM settings (memory, worker reuse, logs);
    the session sets what a session can (SQL settings such as shuffle partitions and the time zone), so a
    stage computes the same thing on the server as in its own JVM."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    # What pyspark's own builder does for a remote: pyspark.sql.functions then build Connect columns in this
    # process (which can no longer start a local SparkContext). Its builder is not used because it refuses
    # the MASTER variable spark-submit sets, and a configured remote wins over spark-submit's master here.
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    builder = ConnectSession.builder.remote(remote).appName(app_name)
    for key, value in session_settings(False, config).items():
        if key.startswith(("spark.sql.", "spark.hadoop.")):
            builder = builder.config(key, value)
    session = builder.getOrCreate()
    log.info("spark: attached to the Spark Connect server %s", remote)
    return session  # type: ignore[return-value]  # the Connect session has the classic one's API


# spark.sql.files.maxPartitionBytes' default: Spark reads a larger file in pieces of this size.
MAX_PARTITION_BYTES = 128 << 20


def file_splits(folder: Path) -> int:
    """About how many tasks Spark reads ``folder``'s Parquet files in: one per file, more for a file over
    ``MAX_PARTITION_BYTES``. Counted from the listing, because a Spark Connect session has no RDD to ask
    (tiny files that Spark packs several to a task count one each: this errs towards more tasks)."""
    return sum(max(1, -(-path.stat().st_size // MAX_PARTITION_BYTES)) for path in folder.glob("*.parquet"))


def parquet_rows(folder: Path) -> int:
    """Rows in ``folder``'s Parquet files, from their footers: no Spark job."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(path).metadata.num_rows for path in folder.glob("*.parquet"))


def python_tasks(rows: int, config: CoreConfig) -> int:
    """How many tasks a Python pass over about ``rows`` rows gets: ``spark.shuffle_partitions``, or fewer
    (at least ``spark.min_rows_per_task`` rows each) on a small input, where every extra task can start one
    more Python worker, whose imports and models cost more than its share of the rows saves."""
    return max(1, min(config.spark.shuffle_partitions, -(-rows // config.spark.min_rows_per_task)))


class SharedFile:
    """A read-only value the workers load from a file once per Python worker: what a broadcast does, for
    Spark Connect as well (which has none). ``.value`` is the value, as with a broadcast."""

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def value(self):
        if self.name not in _SHARED:
            from pyspark import SparkFiles, cloudpickle

            with open(SparkFiles.get(self.name), "rb") as handle:
                _SHARED[self.name] = cloudpickle.load(handle)
        return _SHARED[self.name]


# name -> value, in each Python worker (and in the driver for a local run).
_SHARED: dict[str, object] = {}
# (session, name) pairs already handed to Spark: a file is added once per session.
_ADDED: set[tuple[str, str]] = set()


def share(spark: SparkSession, value) -> SharedFile:
    """``value`` pickled to a file Spark ships to every worker (``SparkContext.addFile``, or the Connect
    session's file artifacts), read there once per Python worker. The file is named by its digest, so
    sharing the same value twice ships it once."""
    import hashlib
    import tempfile

    from pyspark import cloudpickle  # what Spark pickles closures and broadcasts with

    payload = cloudpickle.dumps(value)
    name = f"shared-{hashlib.sha256(payload).hexdigest()[:24]}.pickle"
    connect = is_connect(spark)
    session_id = spark.session_id if connect else spark.sparkContext.applicationId  # type: ignore[attr-defined]
    if (session_id, name) not in _ADDED:
        folder = Path(tempfile.mkdtemp(prefix="pretrain-shared-"))
        path = folder / name
        path.write_bytes(payload)
        if connect:
            spark.addArtifacts(str(path), file=True)  # uploaded now: the local copy can go
            shutil.rmtree(folder)
        else:
            # A local SparkContext serves the file from here to its executors as they start tasks.
            spark.sparkContext.addFile(str(path))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _ADDED.add((session_id, name))
    return SharedFile(name)


@contextlib.contextmanager
def stderr_without(noise: tuple[bytes, ...]) -> Iterator[None]:
    """Processes started in the block (the Spark JVM) write stderr through a pipe, whose lines a thread passes
    on to the real stderr for as long as they live, except lines starting with ``noise``."""
    sys.stderr.flush()
    reader, writer = os.pipe()
    real = os.dup(2)
    os.dup2(writer, 2)
    os.close(writer)

    def forward() -> None:
        with os.fdopen(reader, "rb") as lines:
            for line in lines:
                if not line.startswith(noise):
                    os.write(real, line)

    threading.Thread(target=forward, name="jvm-stderr", daemon=True).start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(real, 2)  # this process writes to its stderr again; the children keep the pipe


def log_progress(context, interval_s: float | None = None) -> None:
    """Log the running Spark stages' task counts every ``interval_s`` (default ``PROGRESS_INTERVAL_S``, read at
    call time) while they change, from a thread that ends with the context: the console progress bar's news, as
    lines a task log can hold."""
    if getattr(context, "_pipeline_progress", None) is not None:
        return
    interval_s = PROGRESS_INTERVAL_S if interval_s is None else interval_s

    def watch() -> None:
        shown = None
        while context._jsc is not None:
            time.sleep(interval_s)
            try:
                tracker = context.statusTracker()
                stages = [tracker.getStageInfo(stage) for stage in sorted(tracker.getActiveStageIds())]
            except Exception:  # the context stopped between two looks
                return
            progress = [
                f"stage {info.stageId} {info.numCompletedTasks}/{info.numTasks} tasks"
                + (f" ({info.numFailedTasks} failed)" if info.numFailedTasks else "")
                for info in stages
                if info is not None
            ]
            if progress and progress != shown:
                log.info("spark: %s", "; ".join(progress))
            shown = progress

    context._pipeline_progress = threading.Thread(target=watch, name="spark-progress", daemon=True)
    context._pipeline_progress.start()


def spark_schema(arrow_schema):
    """The Spark StructType for a pyarrow schema, so mapInArrow outputs are declared once, in Arrow terms."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema)


def aggregate(df: DataFrame, *columns: Column) -> Row:
    """The one row of an aggregation over the whole frame (Spark types ``first()`` as maybe absent; here it never is)."""
    row = df.agg(*columns).first()
    assert row is not None, "an aggregation without grouping returns one row"
    return row


class JobCount:
    """The Spark jobs a block ran (``counted_jobs``): ``jobs`` once the block is over."""

    def __init__(self) -> None:
        self.jobs = 0


@contextlib.contextmanager
def counted_jobs(spark: SparkSession) -> Iterator[JobCount]:
    """How many Spark jobs the block runs in ``spark``'s local JVM: the status tracker's job ids are numbered
    in order per SparkContext, so the block's jobs are the newest id after it less the newest before. A stage's
    small jobs are most of its cost on a small input, so this is what a stage's job ceiling checks
    (``benchmarks/spark_jobs.py``). Not for a Spark Connect session, whose jobs run in the server."""
    tracker = spark.sparkContext.statusTracker()

    def newest() -> int:
        return max(tracker.getJobIdsForGroup(None), default=-1)

    count, before = JobCount(), newest()
    yield count
    count.jobs = newest() - before


def map_in_arrow(df: DataFrame, body, schema) -> DataFrame:
    """``df.mapInArrow(body, schema)``, with each task's Python worker heap frozen first.

    PySpark's daemon runs a full ``gc.collect()`` after every task of a reused worker. With a stage's
    modules, models and word lists loaded, that collection costs tens of milliseconds of CPU per task,
    more than many tasks' own work. ``gc.freeze()`` at a task's start moves everything alive then (all
    of it long-lived: the previous task's garbage is already collected) out of the collector's reach, so
    collections see only the task's own objects. Every Python pass of every stage goes through here.
    """

    def frozen(batches):
        import gc

        gc.freeze()
        yield from body(batches)

    return df.mapInArrow(frozen, schema)


class _FileWriter:
    """One task's Parquet file of a dataset: ``part-<partition>.parquet``, written under a temporary name and
    renamed when complete. Partition 0 writes a file even with no rows, so an empty dataset keeps its schema."""

    def __init__(self, folder: str, arrow_schema, partition: int, attempt: int) -> None:
        import os

        self.arrow_schema = arrow_schema
        self.partition = partition
        self.target = os.path.join(folder, f"part-{partition:05d}.parquet")
        self.temporary = f"{self.target}.{attempt}.tmp"
        self.rows = 0
        self.writer: Any = None

    def write(self, batch) -> None:
        import pyarrow.parquet as pq

        if self.writer is None:
            self.writer = pq.ParquetWriter(self.temporary, self.arrow_schema, compression="zstd")
        self.writer.write_batch(batch.cast(self.arrow_schema) if batch.schema != self.arrow_schema else batch)
        self.rows += batch.num_rows

    def close(self) -> int:
        import os

        if self.writer is None and self.partition == 0:
            _write_empty(self.temporary, self.arrow_schema)
            os.replace(self.temporary, self.target)
        elif self.writer is not None:
            self.writer.close()
            os.replace(self.temporary, self.target)
        return self.rows


def write_parquet(
    df: DataFrame,
    path: Path,
    num_files: int,
    key: str = "id",
    tiebreak: tuple[str, ...] = (),
    known_rows: int | None = None,
) -> int:
    """Write df so the bytes depend only on its rows, not on partitioning or on which JVM ran it.

    Rows go to ``num_files`` files by a hash of ``key`` and are sorted by ``key`` inside each file, then by
    ``tiebreak`` (columns that order rows sharing a key, where the key need not be unique).
    Each Spark task writes its file with pyarrow: Spark's own Parquet writer records column encodings
    in JVM hash-set order, which changes between JVM runs. Returns the number of rows written.
    ``known_rows=0`` (the caller has counted them) writes the empty dataset without a Spark job.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    path.mkdir(parents=True, exist_ok=False)
    arrow_schema = to_arrow_schema(df.schema, timezone="UTC")
    folder = str(path)
    if known_rows == 0:
        _write_empty(path / "part-00000.parquet", arrow_schema)
        return 0

    def write_partition(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        task = TaskContext.get()
        file = _FileWriter(folder, arrow_schema, task.partitionId(), task.taskAttemptId())
        for batch in batches:
            file.write(batch)
        yield pa.RecordBatch.from_pydict({"rows": [file.close()]})

    ordered = df.repartition(num_files, key).sortWithinPartitions(key, *tiebreak)
    # One row per task, summed here: an aggregation in Spark would add a job to every write.
    written = sum(row["rows"] for row in map_in_arrow(ordered, write_partition, "rows long").collect())
    _check_written(path, arrow_schema, written, known_rows)
    return written


def _check_written(path: Path, arrow_schema, written: int, known_rows: int | None) -> None:
    if written == 0 and not any(path.glob("*.parquet")):
        # A DataFrame with no partition at all never runs a task: keep the schema readable anyway.
        _write_empty(path / "part-00000.parquet", arrow_schema)
    if known_rows is not None and written != known_rows:
        raise RuntimeError(f"{path}: wrote {written} rows, {known_rows} were counted")


def write_parquet_parts(
    df: DataFrame,
    parts: Sequence[tuple[Path, Column, Sequence[str | Column], int | None]],
    num_files: int,
    key: str = "id",
    tiebreak: tuple[str, ...] = (),
) -> list[int]:
    """Several datasets from one frame in one Spark job, each as ``write_parquet`` writes it (the same bytes).

    ``parts``: (path, the condition that selects its rows of ``df``, its columns or expressions, its row count
    when the caller has it: 0 writes it without a job). ``key`` and ``tiebreak`` name columns of ``df`` that
    every part shares. Rows are partitioned and sorted once; each task writes its file of every part. Each
    part's rows reach its file in batches of ``spark.sql.execution.arrow.maxRecordsPerBatch``, as they would
    through ``write_parquet``. Returns the row counts, in the order of ``parts``.
    """
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema

    written: list[int | None] = [None] * len(parts)
    pending: list[tuple[int, Path, Column, Sequence[str | Column], int | None]] = []
    for index, (path, where, columns, known_rows) in enumerate(parts):
        if known_rows == 0:
            written[index] = write_parquet(
                df.where(where).select(*columns), path, num_files, key, known_rows=0
            )
        else:
            pending.append((index, path, where, columns, known_rows))
    if len(pending) == 1:
        index, path, where, columns, known_rows = pending[0]
        written[index] = write_parquet(
            df.where(where).select(*columns), path, num_files, key, tiebreak, known_rows
        )
    elif pending:
        schemas = [
            to_arrow_schema(df.where(where).select(*columns).schema, timezone="UTC")
            for _, _, where, columns, _ in pending
        ]
        for _, path, _, _, _ in pending:
            path.mkdir(parents=True, exist_ok=False)
        folders = [str(path) for _, path, _, _, _ in pending]
        batch_rows = int(df.sparkSession.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch") or 10000)
        # A part's row is a struct, null in the rows that belong to another part: the shuffle carries each
        # row once, beside its key.
        combined = df.select(
            F.col(key).alias("_key"),
            *[F.col(name).alias(f"_tiebreak{i}") for i, name in enumerate(tiebreak)],
            *[
                F.when(where, F.struct(*columns)).alias(f"_part{i}")
                for i, (_, _, where, columns, _) in enumerate(pending)
            ],
        )
        ordered = combined.repartition(num_files, "_key").sortWithinPartitions(
            "_key", *[f"_tiebreak{i}" for i in range(len(tiebreak))]
        )

        def write_partition(batches):
            import pyarrow.compute as pc
            from pyspark import TaskContext

            task = TaskContext.get()
            files = [
                _FileWriter(folder, schema, task.partitionId(), task.taskAttemptId())
                for folder, schema in zip(folders, schemas, strict=True)
            ]
            held: list[list] = [[] for _ in files]
            for batch in batches:
                for part, file in enumerate(files):
                    column = batch.column(f"_part{part}")
                    rows = pa.RecordBatch.from_struct_array(pc.filter(column, column.is_valid()))
                    if rows.num_rows:
                        held[part].append(rows)
                    _write_full_batches(file, held[part], batch_rows, final=False)
            for part, file in enumerate(files):
                _write_full_batches(file, held[part], batch_rows, final=True)
            yield pa.RecordBatch.from_pydict(
                {f"rows{part}": [file.close()] for part, file in enumerate(files)}
            )

        schema = ", ".join(f"rows{part} long" for part in range(len(pending)))
        counts = map_in_arrow(ordered, write_partition, schema).collect()
        for part, (index, path, _, _, known_rows) in enumerate(pending):
            total = sum(row[f"rows{part}"] for row in counts)
            _check_written(path, schemas[part], total, known_rows)
            written[index] = total
    return [int(count or 0) for count in written]


def _write_full_batches(file: _FileWriter, held: list, batch_rows: int, final: bool) -> None:
    """Write ``held``'s rows in batches of ``batch_rows`` (and, when ``final``, the rest), leaving the rest held."""
    import pyarrow as pa

    total = sum(batch.num_rows for batch in held)
    if total < batch_rows and not (final and total):
        return
    table = pa.Table.from_batches(held)
    held.clear()
    start = 0
    while total - start >= batch_rows:
        file.write(table.slice(start, batch_rows).combine_chunks().to_batches()[0])
        start += batch_rows
    if start < total:
        rest = table.slice(start).combine_chunks().to_batches()
        if final:
            file.write(rest[0])
        else:
            held.extend(rest)


def _write_empty(target, arrow_schema) -> None:
    """A Parquet file with the schema and no rows, the same bytes whichever way an empty dataset is written."""
    import pyarrow.parquet as pq

    pq.ParquetWriter(target, arrow_schema, compression="zstd").close()


def _is_spark_error(exc: BaseException) -> bool:
    return any(type(e).__module__.startswith(("pyspark", "py4j")) for e in _chain(exc))


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


@contextlib.contextmanager
def input_read_errors(inputs: Sequence[DatasetRef]) -> Iterator[None]:
    """A Spark job that fails reading a file of one of ``inputs`` is re-raised as one DamagedInputError
    whose first line names the file and the stage to re-run, instead of hundreds of lines of task errors
    with the file somewhere in the middle. Other failures pass through unchanged."""
    try:
        yield
    except Exception as exc:
        if not _is_spark_error(exc):
            raise
        text = "\n".join(_message_of(e) for e in _chain(exc))
        folders = [(ref, str(ref.path) + "/") for ref in inputs]
        named = [
            (path, ref)
            for match in _PATH_IN_MESSAGE.finditer(text)
            for ref, folder in folders
            if (path := match.group(1).rstrip(".:")).startswith(folder)
        ]
        # A file beats a folder (a query plan's "Location: [.../documents]" may come first).
        named.sort(key=lambda item: not Path(item[0]).is_file())
        for path, ref in named[:1]:
            raise DamagedInputError(
                f"{path} (part of {ref.what}) cannot be read: {_first_reason(text)}; {ref.rerun_hint}"
            ) from exc
        raise


def _message_of(exc: BaseException) -> str:
    """``str(exc)``, or its type alone when that fails: a Py4JJavaError asks the JVM for its text, and a JVM
    that died of the failure (out of heap) refuses the connection, which must not hide the failure itself."""
    try:
        return str(exc)
    except Exception:
        return type(exc).__name__


def _first_reason(text: str) -> str:
    """The most telling line of a Spark failure: the innermost Java or Python exception message."""
    causes = re.findall(r"(?:Caused by: |^)([A-Za-z_.$]+(?:Exception|Error)[^\n]*)", text, re.MULTILINE)
    line = causes[-1] if causes else text.strip().splitlines()[0]
    return " ".join(line.split())[:300]
