"""The stage registry is the one place that declares the pipeline's shape, and everything agrees with it:
the `pretrain` CLI, each stage's ``__main__``, the config tree, and the layering of ``pipeline.core``.
(The DAG wiring is checked against it in tests/dags/test_dagbag.py.)"""

from __future__ import annotations

import importlib
import inspect
import json
import shutil
import subprocess
import sys

import pytest

from pipeline.cli import COMMANDS, TOOLS, main
from pipeline.config import PipelineConfig
from pipeline.core.config import CoreConfig
from pipeline.core.storage import DatasetRef
from pipeline.stages import STAGES, Stage, _checked, config_sections, downstream, stage
from tests.conftest import PROJECT_ROOT, make_config


def test_every_stage_is_a_subcommand_in_pipeline_order():
    assert list(COMMANDS)[: len(STAGES)] == [entry.name for entry in STAGES]
    assert set(COMMANDS) == {entry.name for entry in STAGES} | set(TOOLS)
    for entry in STAGES:
        module, help_text = COMMANDS[entry.name]
        assert module == entry.entrypoint and help_text.startswith(entry.help)


def test_pretrain_quality_is_a_command(capsys):
    """The README's `pretrain quality` used to fail with `invalid choice: 'quality'`."""
    with pytest.raises(SystemExit) as exit_info:
        main(["quality", "--help"])
    assert exit_info.value.code == 0
    assert "--input-stage" in capsys.readouterr().out


@pytest.mark.parametrize("entry", STAGES, ids=lambda entry: entry.name)
def test_each_entrypoint_defaults_to_the_inputs_the_registry_declares(entry, capsys):
    """`pretrain <stage> --help` and `python -m <package> --help` both show the registry's default input."""
    module = importlib.import_module(entry.entrypoint)
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--snapshot" in out and "--set" in out
    if not entry.reads:  # crawl and ingest start a corpus
        assert "--input-stage " not in out
    else:
        assert f"(default: {entry.default_input})" in out


def test_the_tree_declares_exactly_the_sections_the_registry_names():
    """PipelineConfig spells out one typed field per section (what mypy reads); the registry names each
    section by where its class lives. Every registered section is a field of that class, and nothing else is."""
    fields = PipelineConfig.model_fields
    for name, where in config_sections().items():
        module, _, class_name = where.partition(":")
        section = getattr(importlib.import_module(module), class_name)
        assert fields[name].annotation is section, name
        assert module == f"pipeline.{module.split('.')[1]}.config", where  # a leaf module the tree may import
        assert not module.startswith("pipeline.core"), name  # core holds only shared sections
    assert set(fields) == set(CoreConfig.model_fields) | set(config_sections())
    assert list(fields)[len(CoreConfig.model_fields) :] == list(config_sections())  # in pipeline order


@pytest.mark.parametrize("entry", STAGES, ids=lambda entry: entry.name)
def test_the_registry_names_each_stages_run_function(entry):
    """What the entrypoint and the ablation runner call: ``run(config, inputs, output)``, in the stage's own
    package."""
    assert entry.run.startswith(f"{entry.package}."), entry.run
    run = entry.run_function()
    assert callable(run) and list(inspect.signature(run).parameters) == ["config", "inputs", "output"]


def test_the_registry_refuses_a_stage_that_reads_one_declared_after_it():
    late = Stage(
        name="a",
        package="pipeline.crawl",
        reads=("b",),
        runner="python",
        group="corpus",
        help="",
        run="pipeline.crawl.stage:run",
    )
    with pytest.raises(ValueError, match=r"reads \['b'\], which are not declared before it"):
        _checked((late,))
    with pytest.raises(ValueError, match="declared twice"):
        _checked((STAGES[0], STAGES[0]))
    with pytest.raises(ValueError, match="unknown stage 'dedupe'"):
        stage("dedupe")


def test_downstream_follows_reads_transitively():
    assert [entry.name for entry in downstream("dedup")] == [
        "classify",
        "decontaminate",
        "quality",
        "tokenize",
        "train",
        "export",
        "evaluate",
        "report",
    ]
    assert downstream("report") == []


def test_importing_core_imports_no_stage_package():
    """pipeline.core is the bottom layer: importing all of it pulls in no other pipeline package."""
    script = (
        "import pkgutil, importlib, sys, pipeline.core\n"
        "for info in pkgutil.iter_modules(pipeline.core.__path__):\n"
        "    importlib.import_module('pipeline.core.' + info.name)\n"
        "print([m for m in sys.modules if m.startswith('pipeline.') and not m.startswith('pipeline.core')])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=PROJECT_ROOT
    )
    assert result.stdout.strip() == "[]", result.stdout


def test_the_default_data_root_is_the_current_directorys_data(tmp_path, monkeypatch):
    """Not the folder the package is installed in (an editable install in another checkout wrote there)."""
    monkeypatch.chdir(tmp_path)
    from pipeline.config import load_config

    assert load_config(environ={}).project.data_root == str(tmp_path / "data")


def manifest_inputs(config, name, snapshot):
    return [(ref["stage"], ref["path"]) for ref in DatasetRef.of(config, name, snapshot).manifest().inputs]


@pytest.mark.slow
def test_stages_run_by_hand_in_readme_order_read_the_deduplicated_documents(sample_corpus, tmp_path, capsys):
    """README: clean; dedup; classify; decontaminate; quality; tokenize. Quality and tokenize must read the
    filtered, deduplicated documents, not clean's (they used to default to clean's, so a corpus was tokenized
    without deduplication, silently)."""
    fixture_config, fixture_snapshot = sample_corpus
    root = tmp_path / "data"
    for name in ("crawl", "clean"):
        source = DatasetRef.of(fixture_config, name, fixture_snapshot).path
        shutil.copytree(source, root / fixture_config.project.corpus / name / fixture_snapshot)
    config = make_config(root)
    argv = [
        "--snapshot",
        fixture_snapshot,
        "--set",
        f"project.data_root={root}",
        "--set",
        "logging.console=false",
    ]
    for name in ("dedup", "classify", "decontaminate", "quality", "tokenize"):
        assert main([name, *argv]) == 0, name
    dedup = DatasetRef.of(config, "dedup", fixture_snapshot)
    filtered = DatasetRef.of(config, "decontaminate", fixture_snapshot)
    assert manifest_inputs(config, "classify", fixture_snapshot) == [("dedup", str(dedup.path))]
    assert manifest_inputs(config, "quality", fixture_snapshot) == [("decontaminate", str(filtered.path))]
    assert manifest_inputs(config, "tokenize", fixture_snapshot) == [("decontaminate", str(filtered.path))]
    tokens = DatasetRef.of(config, "tokenize", fixture_snapshot).manifest().rows
    kept = dedup.manifest().rows["documents"]
    assert tokens["train_documents"] + tokens["validation_documents"] == kept
    quality = json.loads(
        (DatasetRef.of(config, "quality", fixture_snapshot).path / "metrics.json").read_text()
    )
    assert quality["documents"] == kept
    assert f"data root {root}" in capsys.readouterr().err


def test_the_readme_runs_the_stages_by_hand_in_registry_order():
    """The README's "Running stages yourself" block names every stage once, in the order they must run."""
    readme = (PROJECT_ROOT / "README.md").read_text()
    block = readme.split("## Running stages yourself", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split()[1] for line in block.splitlines() if line.startswith(".venv/bin/pretrain ")]
    names = {entry.name for entry in STAGES}
    in_order = list(dict.fromkeys(command for command in commands if command in names))
    assert in_order == [entry.name for entry in STAGES]
