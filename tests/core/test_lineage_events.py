"""OpenLineage events from the command line's stage runs (``stage_main``), received by a real HTTP server.

The stage bodies here publish real outputs (Parquet through StageOutput, with random rows and columns), so
each test takes about a second; what is checked is what ``stage_main`` sends about them: the datasets and
counts of the manifests, the code version and config hash, FAIL with the error, and nothing at all (no
client, no connection) when OpenLineage is not configured.
"""

from __future__ import annotations

import json
import queue
import random
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core import lineage_events
from pipeline.core.manifest import Manifest
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.entrypoint import stage_main

OL_ENV = ("OPENLINEAGE_URL", "OPENLINEAGE_CONFIG", "OPENLINEAGE_DISABLED", "OPENLINEAGE_NAMESPACE")
AIRFLOW_ENV = tuple(f"AIRFLOW_CTX_{k}" for k in ("DAG_ID", "DAG_RUN_ID", "TASK_ID", "TRY_NUMBER"))


def random_table(rng: random.Random) -> pa.Table:
    rows = rng.randint(1, 40)
    columns = {"id": pa.array([f"doc-{i}" for i in range(rows)])}
    for index in range(rng.randint(1, 4)):
        kind = rng.choice(["int", "float", "text"])
        name = f"{kind}_{index}"
        if kind == "int":
            columns[name] = pa.array([rng.randint(-5, 5) for _ in range(rows)], pa.int64())
        elif kind == "float":
            columns[name] = pa.array([rng.random() for _ in range(rows)], pa.float64())
        else:
            columns[name] = pa.array([rng.choice("abc") * rng.randint(0, 3) for _ in range(rows)])
    return pa.table(columns)


def publish_parquet(table: pa.Table, excluded: int = 0):
    """A stage body: its documents as Parquet (plus some excluded rows), published with their counts."""

    def run(config, inputs, output):
        with StageOutput(output, config, inputs) as out:
            (out.path / "documents").mkdir()
            pq.write_table(table, out.path / "documents" / "part-0.parquet")
            return out.commit(
                rows={"documents": table.num_rows, "excluded": excluded},
                counters={"kept": table.num_rows, "dropped": {"too_short": excluded}},
            )

    return run


def broken(config, inputs, output):
    raise RuntimeError("stage broke on purpose")


class Receiver:
    """An OpenLineage HTTP endpoint: every POSTed event, in order of arrival."""

    def __init__(self) -> None:
        events: queue.Queue = queue.Queue()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                events.put((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.events = events
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def received(self) -> list[dict]:
        """What arrived; the client sends synchronously, so everything is here once the run returns."""
        found = []
        while not self.events.empty():
            path, event = self.events.get_nowait()
            assert path == "/api/v1/lineage"
            found.append(event)
        return found

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def clean_env(monkeypatch):
    # Airflow's dag.test() (other tests) leaves AIRFLOW_CTX_* in this process's environment.
    for name in (*OL_ENV, *AIRFLOW_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(Path(__file__).parent)  # no openlineage.yml where the client would look for one
    monkeypatch.setenv("HOME", "/nonexistent")


@pytest.fixture
def receiver(clean_env, monkeypatch):
    server = Receiver()
    monkeypatch.setenv("OPENLINEAGE_URL", server.url)
    yield server
    server.close()


def argv(root: Path, snapshot: str) -> list[str]:
    settings = [f"project.data_root={root}", "logging.console=false", "tracking.stage_runs=false"]
    return ["--snapshot", snapshot, *[arg for item in settings for arg in ("--set", item)]]


def by_name(datasets: list[dict]) -> dict[str, dict]:
    return {dataset["name"]: dataset for dataset in datasets}


def test_stage_run_sends_start_and_complete_with_the_manifests_datasets(tmp_path, receiver, clean_env):
    rng = random.Random(47)
    root = tmp_path / "data"
    upstream, documents = random_table(rng), random_table(rng)
    dropped = rng.randint(0, 9)
    assert stage_main(argv(root, "s1"), stage="crawl", description="", run=publish_parquet(upstream)) == 0
    assert (
        stage_main(argv(root, "s1"), stage="clean", description="", run=publish_parquet(documents, dropped))
        == 0
    )

    events = receiver.received()
    assert [(e["eventType"], e["job"]["name"]) for e in events] == [
        ("START", "sample.crawl"),
        ("COMPLETE", "sample.crawl"),
        ("START", "sample.clean"),
        ("COMPLETE", "sample.clean"),
    ]
    start, complete = events[2:]
    assert start["run"]["runId"] == complete["run"]["runId"] != events[0]["run"]["runId"]
    assert complete["job"]["namespace"] == "pretrain"

    crawl = Manifest.read(root / "sample" / "crawl" / "s1" / "manifest.json")
    clean = Manifest.read(root / "sample" / "clean" / "s1" / "manifest.json")
    crawl_name, clean_name = (str((root / "sample" / stage).absolute()) for stage in ("crawl", "clean"))

    # START: the input the stage was given, with its published counts; the output, bare.
    assert [(d["namespace"], d["name"]) for d in start["inputs"]] == [("file", crawl_name)]
    assert [(d["namespace"], d["name"]) for d in start["outputs"]] == [("file", clean_name)]
    assert start["inputs"][0]["facets"]["version"]["datasetVersion"] == crawl.digest

    # COMPLETE: the inputs the output records, and the output with the manifest's counts and the schema.
    (read,) = complete["inputs"]
    assert (read["name"], read["facets"]["version"]["datasetVersion"]) == (crawl_name, crawl.digest)
    assert read["inputFacets"]["inputStatistics"]["rowCount"] == crawl.rows["documents"] == upstream.num_rows
    (wrote,) = complete["outputs"]
    assert wrote["name"] == clean_name
    statistics = wrote["outputFacets"]["outputStatistics"]
    assert statistics == {
        "rowCount": documents.num_rows,
        "size": clean.bytes,
        "fileCount": len(clean.files),
        "_producer": statistics["_producer"],
        "_schemaURL": statistics["_schemaURL"],
    }
    fields = [(f["name"], f["type"]) for f in wrote["facets"]["schema"]["fields"]]
    assert fields == [(field.name, str(field.type)) for field in documents.schema]
    snapshot_facet = wrote["facets"]["pretrain_snapshot"]
    assert snapshot_facet["rows"] == {"documents": documents.num_rows, "excluded": dropped}
    assert snapshot_facet["counters"]["dropped"] == {"too_short": dropped}
    assert (snapshot_facet["snapshot"], snapshot_facet["digest"]) == ("s1", clean.digest)
    run_facet = complete["run"]["facets"]["pretrain_run"]
    assert (run_facet["config_hash"], run_facet["code_version"]) == (clean.config_hash, clean.code_version)
    assert run_facet["_schemaURL"].startswith(lineage_events.PRODUCER)

    # Another snapshot: the same dataset (namespace and name), another version.
    other = random_table(rng)
    assert stage_main(argv(root, "s2"), stage="crawl", description="", run=publish_parquet(other)) == 0
    assert stage_main(argv(root, "s2"), stage="clean", description="", run=publish_parquet(other)) == 0
    later = receiver.received()[-1]
    assert later["eventType"] == "COMPLETE"
    assert (later["outputs"][0]["namespace"], later["outputs"][0]["name"]) == ("file", clean_name)
    assert later["outputs"][0]["facets"]["version"]["datasetVersion"] != clean.digest
    assert later["inputs"][0]["name"] == crawl_name


def test_failed_stage_run_sends_fail_with_the_error(tmp_path, receiver):
    root = tmp_path / "data"
    assert (
        stage_main(argv(root, "s1"), stage="crawl", description="", run=publish_parquet(pa.table({"a": [1]})))
        == 0
    )
    receiver.received()
    with pytest.raises(RuntimeError, match="on purpose"):
        stage_main(argv(root, "s1"), stage="clean", description="", run=broken)
    start, fail = receiver.received()
    assert (start["eventType"], fail["eventType"]) == ("START", "FAIL")
    assert start["run"]["runId"] == fail["run"]["runId"]
    error = fail["run"]["facets"]["errorMessage"]
    assert error["message"] == "RuntimeError: stage broke on purpose"
    assert error["programmingLanguage"] == "python"
    assert "stage broke on purpose" in error["stackTrace"] and "in broken" in error["stackTrace"]
    assert [d["name"] for d in fail["inputs"]] == [str((root / "sample" / "crawl").absolute())]
    assert not (root / "sample" / "clean" / "s1" / "_SUCCESS").exists()


def test_nothing_configured_makes_no_client_and_no_connection(tmp_path, clean_env, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a connection was attempted: {args[1:]}")

    def no_client(*args, **kwargs):
        raise AssertionError("an OpenLineage client was made")

    from openlineage.client import OpenLineageClient

    monkeypatch.setattr(OpenLineageClient, "__init__", no_client)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    root = tmp_path / "data"
    assert (
        stage_main(argv(root, "s1"), stage="crawl", description="", run=publish_parquet(pa.table({"a": [1]})))
        == 0
    )
    assert (root / "sample" / "crawl" / "s1" / "_SUCCESS").is_file()


def test_under_an_airflow_task_the_provider_emits_not_the_child(receiver, monkeypatch, config):
    """The operator's OpenLineage methods describe the task; its child process sends nothing of its own."""
    monkeypatch.setenv("AIRFLOW_CTX_DAG_ID", "corpus_crawl")
    ref = DatasetRef.of(config, "crawl", "s1")
    assert lineage_events.stage_lineage(config, "crawl", "s1", [], ref) is None
    monkeypatch.delenv("AIRFLOW_CTX_DAG_ID")
    assert lineage_events.stage_lineage(config, "crawl", "s1", [], ref) is not None


@pytest.mark.parametrize(
    ("root", "expected"),
    [
        ("/data/lake", ("file", "/data/lake/web/clean")),
        ("file:///data/lake", ("file", "/data/lake/web/clean")),
        ("s3a://bucket/pretrain", ("s3a://bucket", "pretrain/web/clean")),
        ("hdfs://namenode:8020/", ("hdfs://namenode:8020", "web/clean")),
    ],
)
def test_dataset_identity_follows_openlineage_naming(root, expected):
    assert lineage_events.dataset_identity(root, "web", "clean") == expected
