"""TrainOperator (train.launcher=local): a killed task leaves no torchrun agent or worker behind."""

import shutil
import threading
import time

import psutil
import pytest

from operators.train_operator import TrainOperator
from pipeline.core.proc import ChildFailedError
from pipeline.core.storage import DatasetRef


def wait_for(condition, what: str, deadline_s: float = 300.0):
    """Poll until condition() is truthy; a generous deadline only guards against a hung test."""
    end = time.monotonic() + deadline_s
    while not (value := condition()):
        if time.monotonic() > end:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.2)
    return value


def process_tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_on_kill_takes_down_the_whole_torchrun_group(sample_corpus, tmp_path):
    config, snapshot = sample_corpus
    root = tmp_path / "data"
    tokens = DatasetRef.of(config, "tokenize", snapshot)
    shutil.copytree(tokens.path, root / config.project.corpus / "tokenize" / "kill")
    op = TrainOperator(
        task_id="train",
        snapshot="kill",
        config_path="",
        overrides=[f"project.data_root={root}", "train.steps=1000000", "logging.console=false"],
    )
    outcome: dict = {}

    def run_task():
        try:
            outcome["result"] = op.execute({})
        except BaseException as exc:
            outcome["error"] = exc

    task = threading.Thread(target=run_task, daemon=True)
    task.start()
    # torchrun's agent and its two workers (which torch starts in sessions of their own)
    agent = wait_for(lambda: op._process, "torchrun to start")
    tree = wait_for(lambda: _at_least(3, process_tree(agent.pid)), "both ranks to start")

    op.on_kill()  # what Airflow's task runner calls on SIGTERM
    task.join(timeout=120)
    assert not task.is_alive()
    assert isinstance(outcome.get("error"), ChildFailedError)
    assert alive(tree) == []
    leftovers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(root) in " ".join(p.info["cmdline"] or []) and alive([p])
    ]
    assert leftovers == []
    assert not (root / config.project.corpus / "train" / "kill" / "_SUCCESS").exists()


def _at_least(count: int, processes: list) -> list | None:
    return processes if len(processes) >= count else None
