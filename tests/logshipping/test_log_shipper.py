"""The Elasticsearch log shipper: tailing, spool and replay, no loss and no duplicates.

This is a protocol test. No Elasticsearch server can run on our machines, so by default the shipper
talks to ``es_protocol.FakeElasticsearch``, a local HTTP server answering the bulk, ILM, index template
and data stream APIs as Elasticsearch documents them (product header included), through
``es_protocol.FaultProxy``, which injects outages, 429/5xx answers, partial bulk failures and a missing
product header. With ``ELASTICSEARCH_URL`` set (``make es-test``) the very same tests run against that
real cluster, still through the proxy, each in its own ``logs-pretrain-t*`` data stream.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import ecs_logging
import pytest
from elasticsearch import Elasticsearch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.logshipping import log_shipper
from pipeline.logshipping.es_index import ILM_POLICY, INDEX_TEMPLATE, ElasticsearchSink
from pipeline.logshipping.log_shipper import LogShipper, Spool
from tests.logshipping.es_protocol import FakeElasticsearch, FaultProxy
from tests.logshipping.third_party_es import SETUP as THIRD_PARTY_SETUP
from tests.logshipping.third_party_es import NoidaElasticsearch

REAL_CLUSTER = os.environ.get("ELASTICSEARCH_URL")


SERVERS = ["cluster"] if REAL_CLUSTER else ["protocol", pytest.param("noida-db", marks=pytest.mark.slow)]


@pytest.fixture(scope="module", params=SERVERS)
def upstream(request):
    """(URL, logging.elasticsearch_setup): the real cluster of ``make es-test``; else every test runs twice,
    against the protocol stand-in and against noida-db, a server someone else wrote (third_party_es)."""
    if request.param == "cluster":
        yield REAL_CLUSTER, "full"
    elif request.param == "noida-db":
        with NoidaElasticsearch() as server:
            yield server.url, THIRD_PARTY_SETUP
    else:
        with FakeElasticsearch() as fake:
            yield fake.url, "full"


@pytest.fixture(scope="module")
def proxy(upstream):
    url, setup = upstream
    with FaultProxy(url, seed=7) as fault_proxy:
        fault_proxy.setup = setup  # what the shipper installs on first use on this server
        yield fault_proxy


def needs_data_streams(proxy) -> None:
    if proxy.setup != "full":
        pytest.skip("ILM and data streams: covered by the protocol tests only (third_party_es.py)")


def setup_args(proxy) -> list[str]:
    return ["--set", f"logging.elasticsearch_setup={proxy.setup}"]


@pytest.fixture(scope="module")
def reader(upstream):
    """A direct client (no proxy) to read back what arrived."""
    return ElasticsearchSink.from_env(upstream[0], "unused").client


@pytest.fixture
def data_stream(reader, proxy):
    name = f"logs-pretrain-t{uuid.uuid4().hex[:12]}"
    proxy.set_plan([])
    yield name
    forget(reader, name)


def forget(reader, name: str) -> None:
    """Delete a test's data stream (or, on a server without data streams, its index)."""
    reader.options(ignore_status=(400, 404)).indices.delete_data_stream(name=name)
    reader.options(ignore_status=(400, 404)).indices.delete(index=name)


def stored(reader: Elasticsearch, data_stream: str) -> list[dict]:
    missing = reader.options(ignore_status=404)
    if missing.indices.refresh(index=data_stream).meta.status == 404:
        return []
    hits = reader.search(index=data_stream, size=10_000, query={"match_all": {}})["hits"]["hits"]
    return [hit["_source"] for hit in hits]


def sink_for(proxy: FaultProxy, data_stream: str, url: str | None = None, **options) -> ElasticsearchSink:
    options = {"transport_retries": 0, "bulk_retries": 1, "initial_backoff": 0.0, "chunk_size": 7, **options}
    options.setdefault("setup", proxy.setup)
    return ElasticsearchSink.from_env(url or proxy.url, data_stream, **options)


class LogWriter:
    """Appends real ecs-logging lines to files under <root>/_runs/<run>/logs/, remembering each one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.formatter = ecs_logging.StdlibFormatter()
        self.expected: dict[tuple[str, int], str] = {}
        self.partial: dict[Path, tuple[bytes, int]] = {}
        self.counter = 0

    def path(self, index: int) -> Path:
        path = self.root / "_runs" / f"run{index % 2}" / "logs" / f"stage{index}-rank0-{100 + index}.ecs.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def line(self, message: str) -> bytes:
        self.counter += 1
        record = logging.LogRecord("pipeline.test", logging.INFO, __file__, 1, "%s", (message,), None)
        record.__dict__["labels.seq"] = self.counter
        return self.formatter.format(record).encode("utf-8")

    def write(self, index: int, messages: list[str]) -> None:
        path = self.path(index)
        with open(path, "ab") as handle:
            for message in messages:
                if path in self.partial:  # finish the half-written line first
                    data, cut = self.partial.pop(path)
                    offset = handle.tell() - cut
                    handle.write(data[cut:] + b"\n")
                else:
                    data = self.line(message)
                    offset = handle.tell()
                    handle.write(data + b"\n")
                self.expected[(path.relative_to(self.root).as_posix(), offset)] = json.loads(data)["message"]

    def write_partial(self, index: int, message: str) -> None:
        """Half a line (no newline yet): a process in the middle of writing it."""
        path = self.path(index)
        if path in self.partial:
            return
        data = self.line(message)
        with open(path, "ab") as handle:
            handle.write(data[: len(data) // 2])
        self.partial[path] = (data, len(data) // 2)

    def finish_partials(self) -> None:
        for path in list(self.partial):
            self.write(int(path.name.split("-")[0].removeprefix("stage")), ["unused"])


def assert_exactly_once(reader, data_stream, writer: LogWriter) -> None:
    docs = stored(reader, data_stream)
    got = sorted((doc["log"]["file"]["path"], doc["log"]["offset"]) for doc in docs)
    assert got == sorted(writer.expected), "lines lost or duplicated"
    for doc in docs:
        assert doc["message"] == writer.expected[(doc["log"]["file"]["path"], doc["log"]["offset"])]


def test_ships_every_line_once_and_a_restart_sends_nothing_again(tmp_path, proxy, reader, data_stream):
    writer = LogWriter(tmp_path)
    writer.write(0, [f"first {i}" for i in range(20)])
    writer.write(1, ['ünïcode "quoted" \\ back', "tab\there"])
    stats = LogShipper(tmp_path, sink_for(proxy, data_stream)).ship_once()
    assert (stats.read, stats.delivered, stats.pending, stats.errors) == (22, 22, 0, [])
    assert_exactly_once(reader, data_stream, writer)

    restarted = LogShipper(tmp_path, sink_for(proxy, data_stream))
    assert restarted.ship_once().read == 0
    writer.write(0, ["after restart"])
    writer.write(2, ["a new file"])
    stats = restarted.ship_once()
    assert (stats.read, stats.delivered, stats.already_present) == (2, 2, 0)
    assert_exactly_once(reader, data_stream, writer)
    doc = next(d for d in stored(reader, data_stream) if d["message"] == "after restart")
    assert doc["log.level"] == "info" and doc["log"]["logger"] == "pipeline.test"
    assert doc["labels"]["seq"] == writer.counter - 1


def test_first_use_creates_ilm_policy_index_template_and_data_stream(tmp_path, proxy, reader, data_stream):
    needs_data_streams(proxy)
    writer = LogWriter(tmp_path)
    writer.write(0, ["hello"])
    LogShipper(tmp_path, sink_for(proxy, data_stream, retention="12d")).ship_once()
    policy = reader.ilm.get_lifecycle(name=ILM_POLICY)[ILM_POLICY]["policy"]
    assert "rollover" in policy["phases"]["hot"]["actions"]
    assert "delete" in policy["phases"]["delete"]["actions"]
    (template,) = reader.indices.get_index_template(name=INDEX_TEMPLATE)["index_templates"]
    body = template["index_template"]
    assert body["index_patterns"] == ["logs-pretrain-*"] and "data_stream" in body
    settings_ = body["template"]["settings"]  # Elasticsearch answers nested, whatever form was sent
    lifecycle = settings_.get("index.lifecycle.name") or settings_["index"]["lifecycle"]["name"]
    assert lifecycle == ILM_POLICY
    (stream,) = reader.indices.get_data_stream(name=data_stream)["data_streams"]
    assert stream["template"] == INDEX_TEMPLATE
    assert stream["indices"][0]["index_name"].startswith(f".ds-{data_stream}-")


messages = st.text(max_size=40)
events = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 2), st.lists(messages, min_size=1, max_size=25)),
        st.tuples(st.just("partial"), st.integers(0, 2), messages),
        st.tuples(
            st.just("ship"),
            st.lists(
                st.sampled_from(["ok", "down", "429", "502", "503", "partial", "noproduct"]), max_size=6
            ),
        ),
        st.tuples(st.just("restart")),
        st.tuples(st.just("crash")),
    ),
    min_size=1,
    max_size=14,
)


class CrashingShipper(LogShipper):
    """Dies (raises) after sending, before the offsets are saved: the worst moment for duplicates."""

    crash_next = False

    def _save_offsets(self, offsets):
        if self.crash_next:
            self.crash_next = False
            raise RuntimeError("simulated crash")
        super()._save_offsets(offsets)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    script=events,
    spool_max_bytes=st.sampled_from([2_000, 1 << 30]),
    batch_bytes=st.sampled_from([900, 1 << 20]),
)
def test_random_outages_lose_and_duplicate_nothing(proxy, reader, script, spool_max_bytes, batch_bytes):
    data_stream = f"logs-pretrain-t{uuid.uuid4().hex[:12]}"
    root = Path(tempfile.mkdtemp(prefix="ship-"))
    writer = LogWriter(root)

    def new_shipper():
        shipper = CrashingShipper(
            root, sink_for(proxy, data_stream), spool_max_bytes=spool_max_bytes, batch_bytes=batch_bytes
        )
        return shipper

    shipper = new_shipper()
    proxy.bulk_log = []
    try:
        for event in script:
            if event[0] == "write":
                writer.write(event[1], event[2])
            elif event[0] == "partial":
                writer.write_partial(event[1], event[2])
            elif event[0] == "ship":
                proxy.set_plan(event[1])
                try:
                    shipper.ship_once()
                except RuntimeError as exc:
                    assert str(exc) == "simulated crash"
                    shipper = new_shipper()
                proxy.set_plan([])
            elif event[0] == "restart":
                shipper = new_shipper()
            else:
                shipper.crash_next = True
        writer.finish_partials()
        shipper.crash_next = False
        for _ in range(10):
            stats = shipper.ship_once()
            if stats.pending == 0 and stats.read == 0:
                break
        assert stats.pending == 0 and stats.rejected == 0 and not stats.errors
        assert_exactly_once(reader, data_stream, writer)
        # In order: each file's lines were first offered to Elasticsearch in file order.
        first_seen: dict[str, list[int]] = {}
        seen_ids = set()
        for doc_id, path, offset in proxy.bulk_log:
            if doc_id not in seen_ids:
                seen_ids.add(doc_id)
                first_seen.setdefault(path, []).append(offset)
        for offsets in first_seen.values():
            assert offsets == sorted(offsets)
    finally:
        forget(reader, data_stream)


def test_a_server_that_is_not_elasticsearch_is_named_and_lines_wait(tmp_path, proxy, reader, data_stream):
    writer = LogWriter(tmp_path)
    writer.write(0, ["one", "two", "three"])
    proxy.set_plan(["noproduct"] * 3)
    shipper = LogShipper(tmp_path, sink_for(proxy, data_stream))
    stats = shipper.ship_once()
    assert stats.pending == 3 and stats.delivered == 0
    assert any("X-Elastic-Product" in error for error in stats.errors)
    assert stored(reader, data_stream) == []
    proxy.set_plan([])
    stats = LogShipper(tmp_path, sink_for(proxy, data_stream)).ship_once()
    assert (stats.replayed, stats.pending) == (3, 0)
    assert_exactly_once(reader, data_stream, writer)


def test_unparsed_lines_are_kept_and_half_written_lines_wait(tmp_path, proxy, reader, data_stream):
    writer = LogWriter(tmp_path)
    writer.write(0, ["valid"])
    path = writer.path(0)
    with open(path, "ab") as handle:
        garbage_offset = handle.tell()
        handle.write(b"not json \xff at all\n")
    writer.write_partial(0, "still being written")
    shipper = LogShipper(tmp_path, sink_for(proxy, data_stream))
    assert shipper.ship_once().read == 2
    docs = stored(reader, data_stream)
    garbage = next(doc for doc in docs if doc["log"]["offset"] == garbage_offset)
    assert garbage["message"] == "not json \ufffd at all" and "pretrain_unparsed" in garbage["tags"]
    assert "@timestamp" in garbage
    writer.finish_partials()
    assert shipper.ship_once().read == 1
    writer.expected[(path.relative_to(tmp_path).as_posix(), garbage_offset)] = "not json \ufffd at all"
    assert_exactly_once(reader, data_stream, writer)


def test_a_lone_surrogate_escape_is_repaired_tagged_and_shipping_goes_on(
    tmp_path, proxy, reader, data_stream
):
    """A valid JSON line with "\\ud800" used to crash the spool writer on every run, so nothing after it was
    ever read; inside a field the server rejects, it crashed writing rejected.ndjson."""
    writer = LogWriter(tmp_path)
    writer.write(0, ["before"])
    lone = b'{"@timestamp": "2026-11-29T00:00:00Z", "message": "half \\ud800 a pair"}'
    rejected_too = (
        b'{"@timestamp": "2026-11-29T00:00:00Z", "message": "x\\udfff", "pretrain": {"step": "not a number"}}'
    )
    with open(writer.path(0), "ab") as handle:
        lone_offset = handle.tell()
        handle.write(lone + b"\n" + rejected_too + b"\n")
    writer.write(0, ["after"])
    shipper = LogShipper(tmp_path, sink_for(proxy, data_stream))
    stats = shipper.ship_once()
    assert (stats.read, stats.delivered, stats.rejected, stats.pending) == (4, 3, 1, 0)
    repaired = next(doc for doc in stored(reader, data_stream) if doc["log"]["offset"] == lone_offset)
    assert repaired["message"] == "half \ufffd a pair"
    assert "pretrain_invalid_unicode" in repaired["tags"] and repaired["error"]["type"] == "invalid_unicode"
    (quarantined,) = [json.loads(line) for line in shipper.rejected_path.open()]
    assert quarantined["_source"]["message"] == "x\ufffd" and quarantined["status"] == 400
    writer.expected[(writer.path(0).relative_to(tmp_path).as_posix(), lone_offset)] = "half \ufffd a pair"
    assert_exactly_once(reader, data_stream, writer)
    assert shipper.ship_once().read == 0  # the offsets moved past both lines


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "ship-logs", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def test_cli_quarantines_a_rejected_line_and_exits_nonzero(tmp_path, proxy, reader, data_stream):
    writer = LogWriter(tmp_path)
    writer.write(0, ["good one"])
    bad = {"@timestamp": "2026-11-29T00:00:00Z", "message": "bad step", "pretrain": {"step": "not a number"}}
    with open(writer.path(0), "ab") as handle:
        handle.write(json.dumps(bad).encode() + b"\n")
    writer.write(0, ["good two"])
    common = ["--url", proxy.url, "--data-stream", data_stream, "--set", f"project.data_root={tmp_path}"]
    common += setup_args(proxy)
    result = run_cli(*common, "--json")
    assert result.returncode == 1, result.stderr
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    assert (stats["delivered"], stats["rejected"], stats["pending"]) == (2, 1, 0)
    assert "rejected for good" in result.stderr
    (rejected,) = [json.loads(line) for line in (tmp_path / "_ship" / data_stream / "rejected.ndjson").open()]
    assert rejected["status"] == 400 and rejected["_source"]["message"] == "bad step"
    assert_exactly_once(reader, data_stream, writer)
    again = run_cli(*common)
    assert again.returncode == 0 and "read 0 line(s)" in again.stdout


def test_cli_while_elasticsearch_is_down_reports_once_without_tracebacks(tmp_path):
    """The client's retry warnings each carried a traceback: six of them for one run."""
    import socket

    writer = LogWriter(tmp_path)
    writer.write(0, ["waits for the server"])
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    result = run_cli("--url", url, "--set", f"project.data_root={tmp_path}")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    assert "pending 1" in result.stdout and "error: " in result.stdout
    assert "run ship-logs again" in result.stderr


def test_cli_without_url_is_a_clear_config_error(tmp_path):
    result = run_cli("--set", f"project.data_root={tmp_path}", env={"ELASTICSEARCH_URL": ""})
    assert result.returncode == 2
    assert "no Elasticsearch URL" in result.stderr and "Traceback" not in result.stderr


def wait_until(predicate, what: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def test_cli_follow_ships_new_lines_until_interrupted(tmp_path, proxy, reader, data_stream):
    writer = LogWriter(tmp_path)
    writer.write(0, ["before"])
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "ship-logs",
            "--follow",
            "--interval",
            "0.1",
            "--json",
            "--url",
            proxy.url,
            "--data-stream",
            data_stream,
            "--set",
            f"project.data_root={tmp_path}",
            *setup_args(proxy),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: len(stored(reader, data_stream)) == 1, "the first line")
        writer.write(1, ["while following"])
        wait_until(lambda: len(stored(reader, data_stream)) == 2, "the second line")
        writer.write(1, ["just before the end"])
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert json.loads(stdout.strip().splitlines()[-1])["pending"] == 0
    assert_exactly_once(reader, data_stream, writer)


def test_in_process_shipper_sends_this_process_logs(tmp_path, proxy, reader, data_stream):
    from pipeline.entrypoint import start_logging
    from tests.conftest import make_config

    config = make_config(
        tmp_path / "data",
        f"logging.elasticsearch_url={proxy.url}",
        f"logging.data_stream={data_stream}",
        "logging.ship_in_process=true",
        "logging.ship_interval_s=0.1",
        f"logging.elasticsearch_setup={proxy.setup}",
    )
    start_logging(config, "shipper-test")
    background = log_shipper._background
    try:
        assert background is not None and background.is_alive()
        logging.getLogger("pipeline.test").warning("shipped from inside the process")
        wait_until(
            lambda: any(
                d["message"] == "shipped from inside the process" for d in stored(reader, data_stream)
            ),
            "the in-process shipper",
        )
        logging.getLogger("pipeline.test").error("the last words")
    finally:
        last = background.stop()
        log_shipper._background = None
    assert last is not None and last.pending == 0
    messages = [d["message"] for d in stored(reader, data_stream)]
    assert messages.count("the last words") == 1 and messages.count("shipped from inside the process") == 1


def test_spool_keeps_order_across_partial_replays(tmp_path):
    spool = Spool(tmp_path / "spool")

    def action(name: str) -> dict:
        return {"_id": name, "_source": {"message": name}}

    def ids(segment) -> list[str]:
        actions, unreadable = spool.read(segment)
        assert unreadable == []
        return [a["_id"] for a in actions]

    spool.append([action("a"), action("b")])
    spool.append([action("c")])
    first, _ = spool.segments()
    spool.replace(first, [action("b")])
    assert [ids(s) for s in spool.segments()] == [["b"], ["c"]]
    spool.append([action("d")])
    spool.replace(spool.segments()[0], [])
    assert [i for s in spool.segments() for i in ids(s)] == ["c", "d"]
    assert spool.count() == 2
    tricky = [{"_id": "e", "_source": {"message": "nel\x85 ls\u2028 ps\u2029 cr\r lf\n ff\x0c"}}]
    spool.append(tricky)
    assert spool.read(spool.segments()[-1]) == (tricky, [])


def test_another_shipper_holding_the_lock_is_respected(tmp_path, proxy, data_stream):
    writer = LogWriter(tmp_path)
    writer.write(0, ["x"])
    first = LogShipper(tmp_path, sink_for(proxy, data_stream))
    second = LogShipper(tmp_path, sink_for(proxy, data_stream))
    with first._lock(blocking=True):
        assert second.ship_once(blocking=False).skipped
    assert second.ship_once(blocking=False).delivered == 1


def test_ship_logs_help_names_its_options(capsys):
    from pipeline.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["ship-logs", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(
        option in out for option in ("--url", "--follow", "--data-stream", "--set", "ELASTICSEARCH_API_KEY")
    )


# --- poison lines: the shipper never dies, and every line is delivered, rejected with a reason, or pending ---

DOWN = "http://127.0.0.1:9"  # the discard port: nothing listens, so Elasticsearch is unreachable


def write_lines(root: Path, lines: list[bytes]) -> Path:
    path = root / "_runs" / "run0" / "logs" / "poison-rank0-1.ecs.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as handle:
        for line in lines:
            handle.write(line + b"\n")
    return path


def ship_until_settled(shipper: LogShipper) -> list:
    passes = [shipper.ship_once()]
    while passes[-1].read or (passes[-1].pending and len(passes) < 5):
        passes.append(shipper.ship_once())
    return passes


def rejected_entries(shipper: LogShipper) -> list[dict]:
    if not shipper.rejected_path.exists():
        return []
    return [json.loads(line) for line in shipper.rejected_path.read_text().splitlines()]


def test_a_deeply_nested_line_is_shipped_as_text_and_the_lines_behind_it_follow(
    tmp_path, proxy, reader, data_stream
):
    """A log line holding a JSON array nested 200,000 deep: `ship-logs` died with RecursionError and the
    lines behind it were never shipped."""
    writer = LogWriter(tmp_path)
    writer.write(0, ["before"])
    deep = b"[" * 200_000 + b"]" * 200_000
    nested_object = b'{"@timestamp": "2026-11-29T00:00:00Z", "a": ' + b'{"b": ' * 100 + b"1" + b"}" * 101
    path = write_lines(tmp_path, [deep, nested_object])
    writer.write(0, ["after"])
    stats = LogShipper(tmp_path, sink_for(proxy, data_stream)).ship_once()
    assert (stats.read, stats.delivered, stats.rejected, stats.pending) == (4, 4, 0, 0), stats
    poison = [doc for doc in stored(reader, data_stream) if doc["log"]["file"]["path"].endswith(path.name)]
    assert len(poison) == 2 and all("pretrain_unparsed" in doc["tags"] for doc in poison)
    assert {doc["error"]["message"] for doc in poison} == {"JSON nested more than 64 levels deep"}


def test_raw_surrogate_bytes_while_elasticsearch_is_down_are_spooled_repaired(
    tmp_path, proxy, reader, data_stream
):
    """Raw surrogate bytes (invalid UTF-8) on the spool path: UnicodeEncodeError, and the shipper died."""
    lines = [
        b'{"@timestamp": "2026-11-29T00:00:00Z", "message": "raw \xed\xa0\x80 surrogate"}',
        b'{"@timestamp": "2026-11-29T00:00:00Z", "message": "nan", "pretrain": {"loss": NaN}}',
        b'{"message": "odd fields", "tags": "not-a-list", "log": {"file": "not-an-object"}}',
        b"\xff\xfe binary \x00 garbage",
    ]
    write_lines(tmp_path, lines)
    down = LogShipper(tmp_path, sink_for(proxy, data_stream, url=DOWN))
    stats = down.ship_once()
    assert (stats.read, stats.spooled, stats.pending) == (4, 4, 4) and stats.errors
    up = LogShipper(tmp_path, sink_for(proxy, data_stream))
    stats = up.ship_once()
    assert (stats.read, stats.replayed, stats.delivered, stats.pending) == (0, 4, 4, 0), stats
    docs = sorted(stored(reader, data_stream), key=lambda doc: doc["log"]["offset"])
    assert (
        docs[0]["message"] == "raw \ufffd\ufffd\ufffd surrogate"
        and "pretrain_invalid_unicode" in docs[0]["tags"]
    )
    assert "pretrain_unparsed" in docs[1]["tags"] and "NaN is not JSON" in docs[1]["error"]["message"]
    assert (
        docs[2]["tags"] == ["not-a-list", "pretrain_ingest_timestamp"]
        and docs[2]["log"]["file_value"] == "not-an-object"
    )
    assert docs[3]["message"].startswith("\ufffd\ufffd binary")


def test_an_over_long_line_is_shipped_cut_and_tagged_without_being_held_whole(
    tmp_path, proxy, reader, data_stream
):
    huge = b'{"message": "' + b"x" * (3 * log_shipper.MAX_LINE_BYTES) + b'"}'
    write_lines(tmp_path, [huge, b'{"message": "next"}'])
    stats = LogShipper(tmp_path, sink_for(proxy, data_stream)).ship_once()
    assert (stats.read, stats.delivered) == (2, 2), stats
    cut, following = sorted(stored(reader, data_stream), key=lambda doc: doc["log"]["offset"])
    assert (
        "pretrain_truncated" in cut["tags"] and f"a line of {len(huge) + 1} bytes" in cut["error"]["message"]
    )
    assert following["message"] == "next" and following["log"]["offset"] == len(huge) + 1


def test_an_unreadable_spool_line_is_rejected_with_its_reason_and_the_rest_replayed(
    tmp_path, proxy, data_stream
):
    write_lines(tmp_path, [b'{"message": "one"}', b'{"message": "two"}'])
    LogShipper(tmp_path, sink_for(proxy, data_stream, url=DOWN)).ship_once()
    shipper = LogShipper(tmp_path, sink_for(proxy, data_stream))
    (segment,) = shipper.spool.segments()
    segment.write_bytes(segment.read_bytes() + b'{"_id": "x", "_source": {"message": [[[\n\xff\xfe\n')
    stats = shipper.ship_once()
    assert (stats.replayed, stats.rejected, stats.pending) == (2, 2, 0), stats
    assert all(entry["error"].startswith("unreadable spool line") for entry in rejected_entries(shipper))


def test_unreadable_offsets_are_set_aside_and_nothing_is_indexed_twice(tmp_path, proxy, reader, data_stream):
    write_lines(tmp_path, [b'{"message": "one"}'])
    shipper = LogShipper(tmp_path, sink_for(proxy, data_stream))
    assert shipper.ship_once().delivered == 1
    shipper.offsets_path.write_text("{half")
    stats = shipper.ship_once()
    assert (stats.read, stats.already_present) == (1, 1) and len(stored(reader, data_stream)) == 1


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
poison_lines = st.one_of(
    st.binary(min_size=1, max_size=300),
    json_values.map(lambda value: json.dumps(value).encode()),
    st.dictionaries(
        st.sampled_from(["message", "tags", "log", "@timestamp", "error", "pretrain"]), json_values
    ).map(lambda doc: json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    st.integers(1, 5000).map(lambda depth: b"[" * depth + b"]" * depth),
    st.integers(1, 5000).map(lambda depth: b'{"a":' * depth + b"1" + b"}" * depth),
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(lines=st.lists(poison_lines, min_size=1, max_size=12), down_first=st.booleans())
def test_fuzz_no_line_stops_the_shipper_and_every_line_is_accounted_for(proxy, reader, lines, down_first):
    """Random bytes, random JSON, deep nesting: the shipper never raises, and every line it read is
    delivered, rejected with a reason (rejected.ndjson), or pending in the spool."""
    lines = [line.replace(b"\n", b" ").replace(b"\r", b" ") for line in lines]
    lines = [line for line in lines if line.strip()]
    data_stream = f"logs-pretrain-t{uuid.uuid4().hex[:12]}"
    root = Path(tempfile.mkdtemp(prefix="ship-fuzz-"))
    try:
        write_lines(root, lines)
        passes = []
        if down_first:  # through the spool: encoded, written, read back and replayed
            passes += ship_until_settled(LogShipper(root, sink_for(proxy, data_stream, url=DOWN)))
            assert passes[-1].pending == len(lines)
        shipper = LogShipper(root, sink_for(proxy, data_stream))
        passes += ship_until_settled(shipper)
        read = sum(stats.read for stats in passes)
        delivered = sum(stats.delivered for stats in passes)
        rejected = sum(stats.rejected for stats in passes)
        assert read == len(lines)
        assert delivered + rejected + passes[-1].pending == len(lines), passes
        entries = rejected_entries(shipper)
        assert len(entries) == rejected and all(entry["error"] for entry in entries)
        assert len(stored(reader, data_stream)) == delivered
    finally:
        shutil.rmtree(root, ignore_errors=True)
        forget(reader, data_stream)
