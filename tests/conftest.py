"""Shared fixtures. Airflow and Spark settings must be in the environment before either is imported."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="pretrain-airflow-home-"))
os.environ.update(
    {
        "AIRFLOW_HOME": str(_AIRFLOW_HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
    }
)
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
for key in [key for key in os.environ if key.startswith(("PRETRAIN__", "AIRFLOW_CTX_"))]:
    del os.environ[key]

from hypothesis import settings as hypothesis_settings  # noqa: E402

# CI draws the same examples every run, so a red build is reproducible; HYPOTHESIS_PROFILE=explore
# draws fresh ones locally to hunt for new counterexamples. No deadline in either: on a loaded machine one
# example of a property test took 254 ms against Hypothesis' default 200 ms (FlakyFailure), and a test's
# time limit is pytest-timeout's job.
hypothesis_settings.register_profile("ci", derandomize=True, deadline=None)
hypothesis_settings.register_profile("explore", derandomize=False, deadline=None)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

from pipeline.config import PipelineConfig, load_config  # noqa: E402
from pipeline.core.storage import DatasetRef  # noqa: E402


def make_config(data_root: Path, *overrides: str) -> PipelineConfig:
    """A config for tests: small and fast, on a private data root."""
    return load_config(
        None,
        [
            f"project.data_root={data_root}",
            "spark.master=local[2]",
            "spark.shuffle_partitions=4",
            "train.steps=12",
            "train.checkpoint_every=6",
            "logging.console=false",
            *overrides,
        ],
        environ={},
    )


@pytest.fixture
def config(tmp_path: Path) -> PipelineConfig:
    return make_config(tmp_path / "data")


@pytest.fixture(scope="session")
def sample_corpus(tmp_path_factory) -> tuple[PipelineConfig, str]:
    """Crawl, clean and tokenize the bundled sample site once for the whole session."""
    from pipeline.clean import job as clean_job
    from pipeline.crawl import stage as crawl_stage
    from pipeline.tokenization import job as tokenize_job

    config = make_config(tmp_path_factory.mktemp("corpus") / "data")
    snapshot = "fixture"
    ref = lambda stage: DatasetRef.of(config, stage, snapshot)  # noqa: E731
    crawl_stage.run(config, [], ref("crawl"))
    clean_job.run(config, [ref("crawl")], ref("clean"))
    tokenize_job.run(config, [ref("clean")], ref("tokenize"))
    return config, snapshot


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """A migrated SQLite metadata database in a private AIRFLOW_HOME."""
    subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"], check=True, capture_output=True
    )
    return _AIRFLOW_HOME


def pytest_unconfigure(config) -> None:
    """The session's AIRFLOW_HOME (its metadata database and task logs) goes with the session."""
    shutil.rmtree(_AIRFLOW_HOME, ignore_errors=True)


_MODULE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report) -> None:
    module = report.nodeid.split("::", 1)[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    """Where the run's time went, per module (setup, call and teardown together): the budget that
    docs/development.md keeps is per module, and --durations shows single tests only."""
    if not _MODULE_SECONDS:
        return
    total = sum(_MODULE_SECONDS.values())
    terminalreporter.section(f"time per module ({total:.0f} s in tests)")
    for module, seconds in sorted(_MODULE_SECONDS.items(), key=lambda item: -item[1])[:30]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {100 * seconds / total:4.1f}%  {module}")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    # Hypothesis' suggested-@example patch runs libcst, which crashes pytest itself (INTERNALERROR
    # "__provides__") once Scrapy's zope.interface is loaded; the failing example is in the report anyway.
    item.__dict__.pop("_hypothesis_failing_examples", None)
    yield


@pytest.fixture(scope="session")
def spark_connect(tmp_path_factory):
    """One Spark Connect server (pipeline.core.spark_connect, local[2]) for the session's tests that ask for
    it, started at the first such test and stopped when the session ends, however it ends."""
    from pipeline.core.spark_connect import connect_server

    with connect_server(tmp_path_factory.mktemp("spark-connect")) as server:
        yield server
