"""What every benchmark's ``--smoke`` mode shares: the same code path as its full run on the smallest input, in
seconds, so tests/benchmarks/test_smoke.py notices a benchmark that no longer runs. Its figures mean nothing.

A baseline whose library lives only in ``.venv-bench`` runs in smoke mode when it imports; when it does not,
the result says so (``"baseline": "skipped: <module> not installed"``) instead of a ratio."""

from __future__ import annotations

import argparse
import importlib

HELP = "the same code path on the smallest input, in seconds (a test runs it; its figures mean nothing)"


def add_smoke_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--smoke", action="store_true", help=HELP)


def baseline_skipped(module: str) -> str | None:
    """None when ``module`` imports, else the reason its baseline is skipped."""
    try:
        importlib.import_module(module)
    except ImportError:
        return f"skipped: {module} not installed"
    return None
