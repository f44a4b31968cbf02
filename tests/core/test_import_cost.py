"""A Spark stage's Python workers import its job module (to unpickle its functions) once per worker: what that
module imports at load time, every worker pays before its first row. The heavy libraries a stage uses only in
its driver or only on some paths (MLflow, torch, matplotlib, Airflow, Scrapy, fastText, transformers) are
imported where they are used, never at a job module's load."""

from __future__ import annotations

import json
import subprocess
import sys

from pipeline.stages import STAGES

HEAVY = (
    "mlflow",
    "torch",
    "transformers",
    "sentence_transformers",
    "sklearn",
    "matplotlib",
    "airflow",
    "scrapy",
    "fasttext",
    "tokenizers",
)
# What a stage's workers need on every row: tokenize encodes with tokenizers in each worker.
NEEDED = {"tokenize": {"tokenizers"}}

PROBE = """
import importlib, json, sys
heavy = {heavy!r}
found = {{}}
for name, module in {modules!r}:
    before = {{m for m in heavy if m in sys.modules}}
    importlib.import_module(module)
    found[name] = sorted({{m for m in heavy if m in sys.modules}} - before)
print(json.dumps(found))
"""


def test_no_spark_stage_job_module_imports_a_heavy_library_at_load():
    stages = [entry for entry in STAGES if entry.runner == "spark"]
    # Stages that need a heavy module go last, so that it cannot hide another stage's import of it.
    stages.sort(key=lambda entry: entry.name in NEEDED)
    modules = [(entry.name, entry.run.partition(":")[0]) for entry in stages]
    probe = PROBE.format(heavy=HEAVY, modules=modules)
    finished = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]
    found = json.loads(finished.stdout.strip().splitlines()[-1])
    assert set(found) == {name for name, _ in modules}
    loaded = {name: set(imported) - NEEDED.get(name, set()) for name, imported in found.items()}
    assert loaded == {name: set() for name in found}, loaded
