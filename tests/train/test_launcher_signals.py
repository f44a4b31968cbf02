"""`pretrain train` leaves no orphan (issue 17, item 4): SIGTERM to the launcher reaches torchrun and the
ranks, which checkpoint and stop, and the launcher waits for them; a launcher killed outright takes
torchrun and the ranks with it (torchrun's death signal is SIGTERM, so they still checkpoint); a killed
torchrun agent takes its ranks with it. Each time the next `pretrain train` resumes the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from pipeline.core.storage import DatasetRef
from pipeline.model.checkpoint import Checkpointer
from pipeline.train.fault_injection import ENV_FAULT
from pipeline.train.launcher.failures import EXIT_STOPPED
from pipeline.train.launcher.runs import RunRecord
from tests.train.support import (
    finish,
    kill_tree,
    pretrain_train,
    processes_mentioning,
    start,
    torchrun,
    train_config,
    unfinished_run,
    wait_gone,
    write_config,
    write_token_corpus,
)

pytestmark = pytest.mark.slow
SNAPSHOT = "signals"


@pytest.fixture
def prepared(tmp_path):
    config = train_config(tmp_path / "data", "train.nproc_per_node=2")
    write_token_corpus(config, SNAPSHOT)
    # Every process of the test has tmp_path in its command line (the config file it reads).
    yield config, write_config(config, tmp_path / "config.yaml"), str(tmp_path)
    wait_gone(processes_mentioning(str(tmp_path)), timeout_s=0)  # whatever a failure left behind


def with_fault(spec: str) -> dict[str, str]:
    return {**os.environ, ENV_FAULT: spec}


def stopped_at(config) -> tuple[str, list[int]]:
    staging = unfinished_run(config, SNAPSHOT)
    return RunRecord.read(staging).run_id, Checkpointer(staging / "checkpoints").steps()


def resumes_and_finishes(config, path, run: str) -> None:
    output = finish(start(pretrain_train(path, SNAPSHOT)))
    assert f"train {SNAPSHOT}: run {run}" in output  # the same run, not a new one
    manifest = DatasetRef.of(config, "train", SNAPSHOT).manifest()
    assert manifest.extra["run_id"] == run and manifest.rows["steps"] == config.train.steps
    rows = [
        json.loads(line) for line in (DatasetRef.of(config, "train", SNAPSHOT).path / "metrics.jsonl").open()
    ]
    assert [row["step"] for row in rows] == list(range(1, config.train.steps + 1))


def test_sigterm_to_the_launcher_stops_torchrun_and_the_ranks_after_a_checkpoint(prepared):
    config, path, marker = prepared
    launcher = start(pretrain_train(path, SNAPSHOT), env=with_fault("SIGTERM@3:to=pretrain"))
    output = finish(launcher, expect_success=False)

    assert launcher.returncode == EXIT_STOPPED, output[-5000:]
    assert "stopped by SIGTERM after step 3" in output
    assert processes_mentioning(marker) == []  # the launcher returned only once torchrun and the ranks had
    run, steps = stopped_at(config)
    assert steps == [3] and not DatasetRef.of(config, "train", SNAPSHOT).is_complete()
    resumes_and_finishes(config, path, run)


def test_a_launcher_killed_outright_takes_torchrun_and_the_ranks_with_it(prepared):
    config, path, marker = prepared
    launcher = start(pretrain_train(path, SNAPSHOT), env=with_fault("SIGKILL@3:to=pretrain"))
    finish(launcher, expect_success=False)
    assert launcher.returncode == -signal.SIGKILL

    # torchrun got SIGTERM from the kernel, so the ranks checkpointed step 3 and stopped, and nothing went on.
    assert wait_gone(processes_mentioning(marker)) == []
    run, steps = stopped_at(config)
    assert steps == [3] and not DatasetRef.of(config, "train", SNAPSHOT).is_complete()
    resumes_and_finishes(config, path, run)  # the lock went with them


def test_a_killed_torchrun_agent_takes_its_ranks_with_it(prepared):
    config, path, marker = prepared
    agent = torchrun(
        ["--standalone", "--nproc-per-node=2"], path, SNAPSHOT, env={ENV_FAULT: "SIGKILL@3:to=launcher"}
    )
    finish(agent, expect_success=False)
    assert agent.returncode == -signal.SIGKILL

    # Orphaned ranks used to train on to the end and publish; now the kernel kills them with their agent.
    assert wait_gone(processes_mentioning(marker)) == []
    assert not DatasetRef.of(config, "train", SNAPSHOT).is_complete()
    run, steps = stopped_at(config)
    assert steps == []  # killed before the checkpoint of step 3
    resumes_and_finishes(config, path, run)


# A worker that stops its agent, and when the agent's shutdown reaches it (its SIGTERM), stops it again: as
# every rank does whose failure no restart can fix, or the launcher and a rank at once.
SIGNALS_TWICE = """
import os, signal, time
agent = os.getppid()
signal.signal(signal.SIGTERM, lambda *_: os.kill(agent, signal.SIGTERM))
os.kill(agent, signal.SIGTERM)
while True:
    time.sleep(1)
"""


def test_a_second_signal_during_the_agents_shutdown_leaves_no_worker_behind(tmp_path):
    """The second signal used to raise inside torchrun's wait for its workers, so the worker that ignored
    the first SIGTERM was never SIGKILLed and outlived its agent; now only the first signal counts."""
    worker = tmp_path / "signals_twice.py"
    worker.write_text(SIGNALS_TWICE)
    log = tmp_path / "agent.log"
    with log.open("w") as output:
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline.train.launcher.agent",
                "--standalone",
                "--nproc-per-node=1",
                "--shutdown-timeout=1",
                str(worker),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        assert agent.wait(timeout=300) == EXIT_STOPPED, log.read_text()[-5000:]
        assert processes_mentioning(str(worker)) == []
        text = log.read_text()
        assert text.strip().splitlines()[-1] == "torchrun: stopped by SIGTERM" and "Traceback" not in text, (
            text
        )
    finally:
        kill_tree(agent)
        wait_gone(processes_mentioning(str(worker)), timeout_s=0)
