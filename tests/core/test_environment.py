"""Guards for the pinned environment's known traps (see the project's notes on pyspark-client)."""

import re
from pathlib import Path

import pandas
import pyspark
import torch


def test_pyspark_python_files_match_the_spark_jars():
    jars = Path(pyspark.__file__).parent / "jars"
    versions = {
        m.group(1)
        for p in jars.glob("spark-core_*.jar")
        if (m := re.search(r"-(\d+\.\d+\.\d+)\.jar$", p.name))
    }
    assert versions == {pyspark.__version__}, (
        "pyspark-client replaced pyspark's Python files; pin both to one version"
    )


def test_pinned_torch_and_pandas():
    assert torch.__version__.split("+")[0] == "2.13.0"
    assert int(pandas.__version__.split(".")[0]) < 3, "pyspark does not fully support pandas 3"


def test_a_child_line_is_logged_once_at_its_own_level(caplog):
    import logging

    from pipeline.core.proc import log_child_line

    logger = logging.getLogger("test.child")
    with caplog.at_level(logging.DEBUG, logger="test.child"):
        log_child_line(logger, "WARNING scrapy.core.engine: slow site")
        log_child_line(logger, "plain output line")
        log_child_line(logger, "INFO")  # a bare word is not a level prefix
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "scrapy.core.engine: slow site"),
        (logging.INFO, "plain output line"),
        (logging.INFO, "INFO"),
    ]


def test_property_tests_run_without_a_deadline_on_a_busy_machine():
    """Hypothesis' default 200 ms deadline failed a property test at load 5-9 (254 ms once, 14 ms the next):
    conftest.py turns it off once for every profile."""
    import hypothesis

    assert hypothesis.settings().deadline is None
    for name in ("ci", "explore"):
        assert hypothesis.settings.get_profile(name).deadline is None
