"""The Spark stages through a warm Spark Connect server write the bytes they write in local mode.

One tiny corpus (Wikipedia leads, junk, an exact duplicate, a blocked URL, a planted evaluation question) goes
through ingest, clean (with a URL blocklist: a shared file instead of a broadcast), dedup (its hashed-documents
count without an accumulator), classify (a small fastText model; its loads counted in a column) and
decontaminate (its whole-index path) twice: in this process in local mode
(snapshot ``local``), and as each stage's own process attached to the session's server with ``SPARK_REMOTE``
(snapshot ``connect``), as an Airflow worker or a shell with the variable set runs them. The local run also counts
each stage's Spark jobs against a recorded ceiling (``JOB_CEILINGS``). Both runs share one
data root and one config file. And ``pretrain spark-server`` starts, prints the URL a session attaches to,
and stops on SIGINT.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.core.config import ConfigError
from pipeline.core.manifest import MANIFEST_NAME, Manifest
from pipeline.core.spark import counted_jobs, remote_url, spark_session
from pipeline.core.storage import DatasetRef
from tests.classify.texts import junk_documents, wikipedia_extracts
from tests.conftest import make_config

# (stage, its input stage)
CHAIN = (
    ("ingest", None),
    ("clean", "ingest"),
    ("dedup", "clean"),
    ("classify", "dedup"),
    ("decontaminate", "classify"),
)
# The Spark jobs each stage runs in local mode on this corpus (pipeline.core.spark.counted_jobs; the same every
# run): on a small snapshot a stage's time is mostly its jobs, so a change that adds some must say why here.
JOB_CEILINGS = {"ingest": 6, "clean": 6, "dedup": 39, "classify": 8, "decontaminate": 24}
SUBMIT_CONF = ("spark.ui.enabled=false", "spark.driver.host=127.0.0.1", "spark.driver.bindAddress=127.0.0.1")
QUESTION = (
    "which river carries more water into the sea than any other river on earth during the rainy months "
    "of the southern summer"
)
ANSWER = "the amazon river in south america"


def test_the_remote_rule_config_first_then_spark_remote_and_never_two_different_urls(tmp_path):
    config = make_config(tmp_path)
    assert remote_url(config, {}) is None
    assert remote_url(config, {"SPARK_REMOTE": "sc://10.0.0.1:15002"}) == "sc://10.0.0.1:15002"
    set_one = make_config(tmp_path, "spark.remote=sc://127.0.0.1:15002")
    assert remote_url(set_one, {}) == "sc://127.0.0.1:15002"
    assert remote_url(set_one, {"SPARK_REMOTE": "sc://127.0.0.1:15002"}) == "sc://127.0.0.1:15002"
    with pytest.raises(ConfigError, match=r"spark\.remote is sc://127\.0\.0\.1:15002 but .*SPARK_REMOTE"):
        remote_url(set_one, {"SPARK_REMOTE": "sc://10.0.0.1:15002"})
    with pytest.raises(ConfigError, match=r"spark\.remote"):
        load_config(None, ["spark.remote=http://127.0.0.1:15002"], environ={})


def write_corpus(folder: Path) -> list[str]:
    """A JSONL source of ~50 documents; returns the config overrides that read and judge it."""
    folder.mkdir(parents=True)
    extracts = sorted(wikipedia_extracts(), key=len, reverse=True)
    leads, planted = extracts[:40], extracts[40]  # planted: no near duplicate of it for dedup to drop first
    rows = [
        {"text": text, "url": f"https://site{i % 5}.example.org/lead/{i}"} for i, text in enumerate(leads)
    ]
    rows += [
        {"text": text, "url": f"https://junk.example.net/{i}"} for i, text in enumerate(junk_documents(8, 5))
    ]
    rows.append({"text": leads[0], "url": "https://mirror.example.com/copy"})  # an exact duplicate
    rows.append({"text": leads[1], "url": "https://blocked.example.com/page"})  # on the blocklist
    rows.append(
        {"text": f"{planted} Quiz: {QUESTION}? Answer: {ANSWER}.", "url": "https://quiz.example.org/1"}
    )
    sources = folder / "sources"
    sources.mkdir()
    for part in range(2):  # two files: two ingest tasks
        (sources / f"part{part}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[part::2]))
    blocklist = folder / "blocked.txt"
    blocklist.write_text("blocked.example.com\n")
    questions = folder / "questions.jsonl"
    questions.write_text(json.dumps({"question": QUESTION, "answer": ANSWER}) + "\n")
    model = train_fasttext(folder, leads, junk_documents(60, 7))
    return [
        f"ingest.sources=[{sources}]",
        f"clean.url_filter.blocklists=[{{path: {blocklist}}}]",
        f"classify.models=[{{name: tiny, path: {model}, label: __label__good, threshold: 0.5}}]",
        f"decontaminate.sets=[{{name: questions, path: {questions}, fields: [question, answer]}}]",
    ]


def train_fasttext(folder: Path, good: list[str], bad: list[str]) -> Path:
    import fasttext

    lines = [f"__label__good {' '.join(t.split())}" for t in good] + [
        f"__label__bad {' '.join(t.split())}" for t in bad
    ]
    random.Random(1).shuffle(lines)
    training = folder / "labelled.txt"
    training.write_text("\n".join(lines) + "\n")
    # fastText 0.9.x gives NaN on tiny inputs unless dim is a multiple of 10 with 10 threads (classify/config.py).
    model = fasttext.train_supervised(str(training), dim=10, bucket=2000, epoch=5, thread=10, verbose=0)
    path = folder / "tiny.bin"
    model.save_model(str(path))
    return path


def run_locally(config, stage: str, input_stage: str | None, snapshot: str) -> None:
    from pipeline.stages import stage as registered

    inputs = [DatasetRef.of(config, input_stage, snapshot)] if input_stage else []
    registered(stage).run_function()(config, inputs, DatasetRef.of(config, stage, snapshot))


def run_through_server(
    url: str, stage: str, input_stage: str | None, snapshot: str, config_file: Path
) -> None:
    """The stage in a process of its own attached to the server: ``pretrain <stage>`` with SPARK_REMOTE, and
    clean as an Airflow Spark task runs it, by spark-submit with ``spark.remote`` (spark-submit itself refuses
    SPARK_REMOTE beside a master; the stage's configured remote wins over spark-submit's master)."""
    from pipeline.stages import stage as registered

    env = dict(os.environ)
    if stage == "clean":
        command = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[1]"]
        for setting in SUBMIT_CONF:
            command += ["--conf", setting]
        command.append(registered(stage).application_file())
        command += ["--set", f"spark.remote={url}"]
    else:
        command = [sys.executable, "-m", "pipeline.cli", stage]
        env["SPARK_REMOTE"] = url
    command += ["--snapshot", snapshot, "--config", str(config_file)]
    if input_stage:
        command += ["--input-stage", input_stage]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{stage} through {url}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"


def outputs(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.parquet"))}


@pytest.mark.slow
def test_the_stages_through_the_server_write_what_local_mode_writes(spark_connect, tmp_path):
    overrides = write_corpus(tmp_path / "input")
    config = make_config(tmp_path / "data", *overrides)
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config.to_yaml())
    jobs = {}
    for stage, input_stage in CHAIN:
        with counted_jobs(spark_session(config, "local")) as count:
            run_locally(config, stage, input_stage, "local")
        jobs[stage] = count.jobs
    for stage, input_stage in CHAIN:
        run_through_server(spark_connect.url, stage, input_stage, "connect", config_file)
    # Each of those processes attached (its own ECS log file says so) instead of starting a JVM of its own.
    logs = [p.read_text() for p in (tmp_path / "data" / "_runs").rglob("*.ecs.json")]
    attached = sum("attached to the Spark Connect server" in text for text in logs)
    assert attached == len(CHAIN), attached

    for stage, _ in CHAIN:
        local = DatasetRef.of(config, stage, "local").path
        remote = DatasetRef.of(config, stage, "connect").path
        expected, actual = Manifest.read(local / MANIFEST_NAME), Manifest.read(remote / MANIFEST_NAME)
        if stage != "clean":  # clean's config also names the server (spark.remote), which the hash covers
            assert actual.config_hash == expected.config_hash, stage
        local_counters, remote_counters = dict(expected.counters), dict(actual.counters)
        if stage == "classify":
            # How many Python workers loaded the model: each side's own, one or two of local[2]'s.
            loads = local_counters.pop("model_loads"), remote_counters.pop("model_loads")
            assert all(1 <= count["tiny"] <= 2 for count in loads), loads
        assert remote_counters == local_counters, stage
        assert expected.rows == actual.rows and expected.rows, stage
        files = outputs(local)
        assert files, stage
        if stage == "dedup":
            # keys/ rows name their own snapshot; the rest must match byte for byte.
            files = {name: data for name, data in files.items() if not name.startswith("keys/")}
        assert {name: outputs(remote)[name] for name in files} == files, stage
    assert expected.counters["dropped"], "the planted question is found"
    clean = Manifest.read(DatasetRef.of(config, "clean", "local").path / MANIFEST_NAME).counters
    assert any("url" in reason for reason in clean["dropped"]), clean["dropped"]
    assert all(jobs[stage] <= JOB_CEILINGS[stage] for stage in jobs), (
        f"Spark jobs {jobs}, ceilings {JOB_CEILINGS}"
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_the_spark_server_command_prints_its_url_serves_a_session_and_stops_on_sigint(tmp_path):
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "spark-server",
            "--port",
            str(port),
            "--folder",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        first = server.stdout.readline()  # printed once the server accepts connections
        assert first.startswith(f"Spark Connect server sc://127.0.0.1:{port} "), first + server.stdout.read()
        attach = (
            "from pyspark.sql import SparkSession\n"
            f"spark = SparkSession.builder.remote('sc://127.0.0.1:{port}').getOrCreate()\n"
            "print(spark.range(5).selectExpr('sum(id) AS total').first()['total'])\n"
        )
        done = subprocess.run([sys.executable, "-c", attach], capture_output=True, text=True, timeout=120)
        assert done.stdout.strip() == "10", done.stderr[-3000:]
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=60) == 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the JVM went with it: nothing listens on the port
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) != 0:
                    break
            time.sleep(0.5)
        else:
            pytest.fail(f"port {port} still accepts after the server stopped")
        with pytest.raises(ProcessLookupError):
            os.killpg(server.pid, 0)  # the whole process group, JVM included, is gone
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
