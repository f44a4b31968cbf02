"""Benchmarks run in their smoke mode: the same code path on the smallest input, so a change that breaks a
benchmark (and leaves its figures in benchmarks/RESULTS.md unreproducible) fails here. The figures a smoke run
prints mean nothing; only that it runs to its JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(script: str, *arguments: str) -> dict:
    finished = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *arguments],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    return json.loads(finished.stdout.strip().splitlines()[-1])


def test_train_cpu_runs_our_trainer_and_the_plain_loop_on_a_real_token_snapshot():
    """It died once the trainer resolved its data through the tokenizer a token output names, because its
    synthetic snapshot named none."""
    result = run_benchmark("train_cpu.py", "--smoke", "--no-defaults")
    assert result["timed_steps"] == 4 and result["trainer_tokens_per_s"] > 0
    assert result["plain_loop_tokens_per_s"] > 0 and result["final_loss"] > 0
