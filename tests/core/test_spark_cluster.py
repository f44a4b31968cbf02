"""The Spark stages on a real standalone cluster write the bytes they write in local mode.

A master and two workers (1 core, 1 GiB each) run on 127.0.0.1 from pyspark's own jars
(``pipeline.core.spark_cluster``, which ``make spark-cluster`` starts too). One crawl of the bundled sample
site is cleaned, deduplicated and tokenized twice: in this process with ``local[2]`` (snapshot ``local``), and
on the cluster (snapshot ``cluster``): clean and tokenize by ``spark-submit --master spark://...`` on each
stage's ``__main__.py``, as the stages' docs say to run them, and dedup by the Airflow operator through the
``pretrain_spark`` connection naming the master. Both runs share one data root and one config, so the
manifests' config hashes must agree too.
"""

import shutil
import signal
import socket
import sys
from pathlib import Path

import pytest

from operators.spark import PipelineSparkSubmitOperator, stage_application
from pipeline.core import spark_cluster
from pipeline.core.manifest import MANIFEST_NAME, SUCCESS_NAME, Manifest
from pipeline.core.proc import ChildFailedError, run_streaming
from pipeline.core.spark_cluster import ClusterStartError, standalone_cluster
from pipeline.core.storage import DatasetRef
from tests.conftest import make_config

pytestmark = pytest.mark.slow

STAGES = ("clean", "dedup", "tokenize")
# What legitimately differs between two runs of one stage on one input: when and how long it ran
# (created_at, duration_s, and the per-step timings in dedup's and tokenize's extra), where it wrote and read (path and
# snapshot, of the output and of each input: the runs are two snapshots), who started it (lineage:
# an Airflow task for dedup on the cluster) and which MLflow run tracks it (tracking). Everything else, the files'
# checksums and sizes first, must match.
RUN_FIELDS = ("created_at", "duration_s", "path", "snapshot", "lineage", "tracking")
STEP_TIMINGS = {"dedup": "step_seconds", "tokenize": "seconds"}
# Files whose rows name their own snapshot (dedup's stored keys, read by later snapshots' dedup.against): they
# are compared as tables without that column, and so the manifest's digest and byte total are left out too.
NAMES_ITS_SNAPSHOT = {"dedup": "keys/"}
# The driver stays on loopback with the cluster, and no driver UI is needed.
LOOPBACK_DRIVER = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Stopped when the module's tests end, passed or failed (the context manager's finally)."""
    with standalone_cluster(
        tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1, memory="1g"
    ) as running:
        yield running


def comparable(manifest: Manifest) -> dict:
    data = manifest.to_dict()
    for key in RUN_FIELDS:
        data.pop(key)
    data["inputs"] = [
        {
            k: v
            for k, v in ref.items()
            if k not in ("path", "snapshot") and not (k == "digest" and ref["stage"] in NAMES_ITS_SNAPSHOT)
        }
        for ref in data["inputs"]
    ]
    if manifest.stage in STEP_TIMINGS:
        data["extra"].pop(STEP_TIMINGS[manifest.stage])
    if manifest.stage in NAMES_ITS_SNAPSHOT:
        prefix = NAMES_ITS_SNAPSHOT[manifest.stage]
        data["files"] = {name: entry for name, entry in data["files"].items() if not name.startswith(prefix)}
        data.pop("digest"), data.pop("bytes")
    return data


def without_snapshot_column(folder: Path):
    import pyarrow.parquet as pq

    table = pq.read_table(folder)
    assert set(table.column("snapshot").to_pylist()) == {folder.parent.name}
    return table.drop_columns(["snapshot"]).sort_by("id")


def spark_submit(cluster, stage: str, snapshot: str, config_file: Path, *arguments: str) -> None:
    """The command each stage's __main__ documents, against the cluster's master."""
    command = [
        str(Path(sys.executable).parent / "spark-submit"),
        *("--master", cluster.master_url),
        *(arg for key, value in LOOPBACK_DRIVER.items() for arg in ("--conf", f"{key}={value}")),
        stage_application(stage),
        *("--snapshot", snapshot, "--config", str(config_file)),
        *arguments,
    ]
    lines: list[str] = []
    try:
        run_streaming(command, on_line=lines.append, die_with_parent=signal.SIGTERM)
    except ChildFailedError as failed:
        pytest.fail(f"{failed}\n" + "\n".join(lines[-60:]))


def test_clean_dedup_and_tokenize_on_a_standalone_cluster_match_local_mode(cluster, tmp_path, monkeypatch):
    assert cluster.alive_workers() == 2
    config = make_config(tmp_path / "data")
    assert config.spark.master == "local[2]"
    config_file = tmp_path / "config.yaml"  # the cluster runs get exactly this tree, spark.master aside
    config_file.write_text(config.to_yaml())
    ref = lambda stage, snapshot: DatasetRef.of(config, stage, snapshot)  # noqa: E731

    from pipeline.clean import job as clean_job
    from pipeline.crawl import stage as crawl_stage
    from pipeline.dedup import job as dedup_job
    from pipeline.tokenization import job as tokenize_job

    crawl_stage.run(config, [], ref("crawl", "local"))
    shutil.copytree(ref("crawl", "local").path, ref("crawl", "cluster").path)  # one crawl, read by both runs
    clean_job.run(config, [ref("crawl", "local")], ref("clean", "local"))
    dedup_job.run(config, [ref("clean", "local")], ref("dedup", "local"))
    tokenize_job.run(config, [ref("dedup", "local")], ref("tokenize", "local"))

    spark_submit(cluster, "clean", "cluster", config_file)
    monkeypatch.setenv("AIRFLOW_CONN_PRETRAIN_SPARK", cluster.connection_uri)
    operator = PipelineSparkSubmitOperator(
        stage="dedup", snapshot="cluster", config_path=str(config_file), overrides=[], conf=LOOPBACK_DRIVER
    )
    assert operator.execute({}) == str(ref("dedup", "cluster").path)
    # As locally: tokenize reads dedup's documents (the classify and decontaminate stages between them pass
    # a default run's documents through unchanged; tests/classify and tests/decontaminate cover them).
    spark_submit(cluster, "tokenize", "cluster", config_file, "--input-stage", "dedup")

    # They ran on the cluster, one app per stage (named by its session), with an executor on each worker.
    apps = {app["name"]: app for app in cluster.state()["completedapps"]}
    assert set(apps) == {f"{stage}-sample-cluster" for stage in STAGES}, apps
    assert all(app["state"] == "FINISHED" and app["cores"] == 2 for app in apps.values()), apps

    for stage in STAGES:
        local, on_cluster = ref(stage, "local").path, ref(stage, "cluster").path
        assert (on_cluster / SUCCESS_NAME).is_file()
        expected, actual = Manifest.read(local / MANIFEST_NAME), Manifest.read(on_cluster / MANIFEST_NAME)
        assert expected.files, stage
        assert comparable(actual) == comparable(expected), stage
        for name in comparable(expected)["files"]:  # the bytes themselves, not only the recorded checksums
            assert (on_cluster / name).read_bytes() == (local / name).read_bytes(), f"{stage}/{name}"
        if stage in NAMES_ITS_SNAPSHOT:
            folder = NAMES_ITS_SNAPSHOT[stage].rstrip("/")
            assert without_snapshot_column(on_cluster / folder).equals(
                without_snapshot_column(local / folder)
            )
        written = {p.relative_to(on_cluster).as_posix() for p in on_cluster.rglob("*") if p.is_file()}
        assert written == {*expected.files, MANIFEST_NAME, SUCCESS_NAME}, stage
    assert Manifest.read(ref("tokenize", "cluster").path / MANIFEST_NAME).rows["train_documents"] > 0


def test_a_master_that_cannot_start_fails_the_start_at_once_and_nothing_is_left(tmp_path, monkeypatch):
    """Its port taken (by anyone, after free_port() chose it), the master exits; the start says so with the
    master's log, and the worker already started is stopped too."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(spark_cluster, "free_port", lambda: taken.getsockname()[1])
        started = []
        monkeypatch.setattr(
            spark_cluster.StandaloneCluster,
            "stop",
            record_and_stop(spark_cluster.StandaloneCluster.stop, started),
        )
        with (
            pytest.raises(ClusterStartError, match=r"spark master exited with status") as failed,
            standalone_cluster(tmp_path, workers=1),
        ):
            pytest.fail("the cluster started on a port in use")
    assert "BindException" in str(failed.value) or "Address already in use" in str(failed.value)
    (processes,) = started
    assert len(processes) == 2 and all(process.poll() is not None for process in processes)


def record_and_stop(stop, started):
    def recording(cluster):
        started.append([process for _, process in cluster.processes])
        stop(cluster)

    return recording


def test_a_cluster_not_ready_in_time_fails_with_every_daemons_log_and_nothing_is_left(tmp_path, monkeypatch):
    """Once a start under double load saw the master log workers registering again and again, never ALIVE;
    the error carried only the master's log. Now it carries the master's state and every daemon's log."""
    started = []
    monkeypatch.setattr(
        spark_cluster.StandaloneCluster,
        "stop",
        record_and_stop(spark_cluster.StandaloneCluster.stop, started),
    )
    # No JVM starts in 10 ms: the deadline passes before any worker can be ALIVE.
    with (
        pytest.raises(ClusterStartError, match=r"0 of 1 workers ALIVE") as failed,
        standalone_cluster(tmp_path, workers=1, ready_timeout_s=0.01),
    ):
        pytest.fail("the cluster was ready in 10 ms")
    message = str(failed.value)
    assert "master state" in message
    for name in ("master", "worker-0"):
        assert f"---- {name} ({tmp_path / 'logs' / name}.log) ----" in message
    (processes,) = started
    assert all(process.poll() is not None for process in processes)


def test_a_second_cluster_on_the_machine_starts_while_the_first_holds_sparks_fixed_ports(tmp_path):
    """Two suites run at once: the second master failed to bind the REST submission server's fixed port
    6066, stayed in STANDBY and refused its workers until the 300 s deadline. Here this test holds 6066 (or
    someone else already does), and the cluster must still come up with its master ALIVE."""
    with socket.socket() as held:
        try:
            held.bind(("127.0.0.1", 6066))
            held.listen()
        except OSError:
            pass  # already taken: the same condition
        with standalone_cluster(tmp_path, workers=1) as running:
            state = running.state()
            assert state is not None and state["status"] == "ALIVE" and running.alive_workers() == 1
