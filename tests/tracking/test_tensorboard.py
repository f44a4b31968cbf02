"""TensorBoard events written by the helper, read back by TensorBoard's own loader; `pretrain tensorboard`."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pipeline.core.storage import STAGING_PREFIX
from pipeline.tracking.tensorboard import TensorBoardWriter, main


def test_scalars_histograms_and_text_round_trip(tmp_path):
    rng = random.Random(5)
    losses = [rng.uniform(0, 10) for _ in range(25)]
    writer = TensorBoardWriter(tmp_path / "tb")
    layer = torch.nn.Linear(4, 3)
    layer(torch.randn(2, 4)).sum().backward()
    for step, loss in enumerate(losses, start=1):
        writer.scalars({"loss": loss, "lr": 0.1 / step, "skipped": None}, step)
    writer.histograms(layer.named_parameters(), step=25)
    writer.text("samples", "The bees **hum**", step=25)
    writer.close()

    events = EventAccumulator(
        str(tmp_path / "tb"), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0}
    )
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 26))
    assert [e.value for e in events.Scalars("train/loss")] == pytest.approx(losses, rel=1e-6)
    assert "train/skipped" not in events.Tags()["scalars"]
    histograms = set(events.Tags()["histograms"])
    assert {"weights/weight", "weights/bias", "grads/weight", "grads/bias"} <= histograms
    weight = events.Histograms("weights/weight")[0].histogram_value
    assert weight.num == 12 and weight.min == pytest.approx(float(layer.weight.detach().min()))
    assert "samples/text_summary" in events.Tags()["tensors"]


def train_root(tmp_path):
    return tmp_path / "data" / "sample" / "train"


def test_command_shows_a_snapshots_runs_or_finds_the_named_run_published_or_running(tmp_path, capsys):
    common = ["--set", f"project.data_root={tmp_path / 'data'}", "--print-command"]
    snapshot = train_root(tmp_path) / "s1"
    running = snapshot / f"{STAGING_PREFIX}r1@resume" / "tensorboard"
    running.mkdir(parents=True)
    assert main([*common, "--snapshot", "s1", "--port", "7007"]) == 0
    command = capsys.readouterr().out.split()
    assert command[command.index("--logdir") + 1] == str(snapshot)  # every run of the snapshot
    assert command[command.index("--port") + 1] == "7007" and "tensorboard.main" in command

    main([*common, "--snapshot", "s1", "--set", "train.run_id=r1"])
    assert f"--logdir {running} " in capsys.readouterr().out
    published = snapshot / "r1" / "tensorboard"
    published.mkdir(parents=True)
    main([*common, "--snapshot", "s1", "--set", "train.run_id=r1"])
    assert f"--logdir {published} " in capsys.readouterr().out
    main(common)
    assert f"--logdir {train_root(tmp_path)} " in capsys.readouterr().out


def test_missing_events_are_a_clear_error(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "tensorboard",
            "--snapshot",
            "nope",
            "--set",
            f"project.data_root={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "no TensorBoard events" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_pretrain_tensorboard_serves_the_snapshot_runs(tmp_path):
    events = train_root(tmp_path) / "s1" / "r1" / "tensorboard"
    writer = TensorBoardWriter(events)
    writer.scalars({"loss": 3.0}, 1)
    writer.close()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "tensorboard",
            "--snapshot",
            "s1",
            "--port",
            str(port),
            "--set",
            f"project.data_root={tmp_path / 'data'}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                runs = json.loads(
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5).read()
                )
                if runs:
                    break
            except OSError:
                pass
            assert process.poll() is None, "tensorboard exited"
            assert time.monotonic() < deadline, "tensorboard did not come up"
            time.sleep(0.3)
        assert runs == ["r1/tensorboard"]
        tags = json.loads(
            urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5).read()
        )
        assert "train/loss" in tags["r1/tensorboard"]
    finally:
        process.terminate()
        process.wait(timeout=30)
