"""Against a real ``mlflow server`` (SQLite backend, local artifact root, free port on 127.0.0.1): a tiny
torchrun training and the report stage, both through their real entrypoints as Airflow would start
them, then everything read back through ``MlflowClient`` — run, metrics, artifacts, registered model —
and the lineage walk: model version -> run -> dataset digest -> manifest -> snapshot path."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from pipeline.config import load_config
from pipeline.core.manifest import MANIFEST_NAME, Manifest
from pipeline.core.proc import kill_group
from pipeline.core.storage import DatasetRef
from pipeline.report.mlflow_report import load_model
from pipeline.tracking.mlflow_runs import PARENT_TAG

DAG_RUN = "manual__2026-11-29T10:00:00+00:00"
STEPS = 8


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow-server")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log_path = root / "server.log"
    with open(log_path, "w") as log_file:
        process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "mlflow"),
                "server",
                "--backend-store-uri",
                f"sqlite:///{root / 'mlflow.db'}",
                "--artifacts-destination",
                str(root / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if urllib.request.urlopen(f"{url}/health", timeout=5).status == 200:
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        kill_group(process)


@pytest.fixture(scope="module")
def trained(sample_corpus, mlflow_server, tmp_path_factory):
    """Train (torchrun, 2 ranks), export, evaluate and report through `pretrain train` / `export` /
    `evaluate` / `report`, as Airflow tasks."""
    from pipeline.evaluate.__main__ import main as evaluate_main
    from pipeline.export.__main__ import main as export_main
    from pipeline.report.__main__ import main as report_main
    from pipeline.train.__main__ import main as train_main

    corpus_config, snapshot = sample_corpus
    root = tmp_path_factory.mktemp("tracked") / "data"
    # A private copy of the token shards, so this training does not race the train stage's own test.
    source = DatasetRef.of(corpus_config, "tokenize", snapshot).path
    shutil.copytree(source, root / "sample" / "tokenize" / snapshot)
    overrides = [
        f"project.data_root={root}",
        f"train.steps={STEPS}",
        "train.checkpoint_every=4",
        "tracking.sample_tokens=6",
        "logging.console=false",
    ]
    argv = ["--snapshot", snapshot, *[arg for item in overrides for arg in ("--set", item)]]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
        for key, value in {
            "AIRFLOW_CTX_DAG_ID": "pretrain_pipeline",
            "AIRFLOW_CTX_DAG_RUN_ID": DAG_RUN,
            "AIRFLOW_CTX_TRY_NUMBER": "1",
        }.items():
            patch.setenv(key, value)
        patch.setenv("AIRFLOW_CTX_TASK_ID", "train")
        assert train_main(argv) == 0
        for task, main in (("export", export_main), ("evaluate", evaluate_main), ("report", report_main)):
            patch.setenv("AIRFLOW_CTX_TASK_ID", task)
            assert main(argv) == 0
    config = load_config(None, overrides, environ={})  # what the stages resolved
    return config, snapshot, MlflowClient(mlflow_server, registry_uri=mlflow_server), mlflow_server


@pytest.mark.slow
def test_training_run_holds_params_metrics_artifacts_and_tags(trained):
    config, snapshot, client, _server = trained
    report = DatasetRef.of(config, "report", snapshot).manifest()
    train = DatasetRef.of(config, "train", snapshot).manifest()
    assert report.extra["tracking_uri"].startswith("http://127.0.0.1:")
    run = client.get_run(report.extra["mlflow_run_id"])
    tags = run.data.tags

    assert run.info.status == "FINISHED" and tags["pretrain.stage"] == "train"
    assert tags["pretrain.output_digest"] == train.digest  # the launcher's stage run, found by digest
    assert (tags["airflow.dag_id"], tags["airflow.run_id"], tags["airflow.task_id"]) == (
        "pretrain_pipeline",
        DAG_RUN,
        "train",
    )
    assert tags["airflow.try_number"] == "1" and tags["config_hash"] == train.config_hash
    assert tags["git_commit"] == train.code_version
    # The config as the launcher ran it: naming the training run it chose (the report reads that run).
    ran_with = config.with_run(train.extra["run_id"])
    expected_params = {k: v if isinstance(v, str) else json.dumps(v) for k, v in ran_with.flat().items()}
    assert run.data.params == expected_params
    assert tags["pretrain.train_run"] == train.extra["run_id"] == report.extra["train_run"]

    history = [
        json.loads(line) for line in (DatasetRef.of(config, "train", snapshot).path / "metrics.jsonl").open()
    ]
    for key in ("loss", "lr", "tokens_per_s", "step_time_s", "grad_norm"):
        logged = client.get_metric_history(run.info.run_id, key)
        assert [(m.step, m.value) for m in logged] == [
            (row["step"], pytest.approx(row[key])) for row in history
        ]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_loss")] == [STEPS]

    def files(path=None):
        found = []
        for item in client.list_artifacts(run.info.run_id, path):
            found.extend(files(item.path) if item.is_dir else [item.path])
        return found

    artifacts = set(files())
    assert {
        "config.yaml",
        "plots/training.png",
        "tokenizer/tokenizer.json",
        "samples/generations.json",
        "samples/generations.txt",
        "model/MLmodel",
        "model/hf_generator.py",
        "model/artifacts/hf_model/config.json",
        "model/artifacts/hf_model/model.safetensors",
        "model/artifacts/hf_model/tokenizer.json",
        "model/artifacts/checkpoint/model.pt",
        "model/artifacts/checkpoint/checkpoint.json",
        "model/artifacts/checkpoint/model_config.json",
        "evaluation/metrics.json",
        "evaluation/generations.json",
        "evaluation/plots/loss_by_language.png",
        "model/artifacts/checkpoint/tokenizer.json",
    } <= artifacts
    assert {
        f"manifests/{stage}/manifest.json" for stage in ("crawl", "clean", "tokenize", "train")
    } <= artifacts


@pytest.mark.slow
def test_registered_model_loads_and_reproduces_the_logged_samples(trained):
    config, snapshot, client, server = trained
    report = DatasetRef.of(config, "report", snapshot).manifest()
    train_ref = DatasetRef.of(config, "train", snapshot)
    name, version = report.extra["registered_model"], report.extra["model_version"]
    assert name == "pretrain-sample-tiny"
    model_version = client.get_model_version(name, version)
    assert model_version.run_id == report.extra["mlflow_run_id"]
    assert model_version.tags["snapshot"] == snapshot
    assert model_version.tags["train_digest"] == train_ref.manifest().digest

    model = load_model(f"models:/{name}/{version}", tracking=server)
    checkpoint = torch.load(train_ref.path / train_ref.manifest().extra["checkpoint"], weights_only=True)
    for key, tensor in checkpoint["model"].items():
        assert torch.equal(model.state_dict()[key], tensor), key

    local = client.download_artifacts(report.extra["mlflow_run_id"], "samples/generations.json")
    samples = json.loads(Path(local).read_text())
    assert [s["prompt"] for s in samples] == config.tracking.sample_prompts
    for sample in samples:
        assert len(sample["generated_ids"]) <= config.tracking.sample_tokens
        ids = list(sample["prompt_ids"])  # reference: arg-max of a full forward pass, no KV cache
        with torch.no_grad():
            for _ in sample["generated_ids"]:
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        assert ids[len(sample["prompt_ids"]) :] == sample["generated_ids"]


@pytest.mark.slow
def test_lineage_walk_from_model_version_to_snapshot(trained):
    config, snapshot, client, _server = trained
    (version,) = client.search_model_versions("name = 'pretrain-sample-tiny'")
    run = client.get_run(version.run_id)
    (training_input,) = [
        d
        for d in run.inputs.dataset_inputs
        if {t.key: t.value for t in d.tags}["mlflow.data.context"] == "training"
    ]
    dataset = training_input.dataset
    location = Path(json.loads(dataset.source)["uri"])
    manifest = Manifest.read(location / MANIFEST_NAME)
    assert manifest.digest == dataset.digest
    assert (manifest.stage, manifest.snapshot) == ("tokenize", snapshot)
    assert location == DatasetRef.of(config, "tokenize", snapshot).path
    assert json.loads(dataset.profile)["rows"] == manifest.rows

    # ... and on up the chain to the crawl snapshot that started it.
    stages, current = [], manifest
    while current.inputs:
        (parent_ref,) = current.inputs
        current = Manifest.read(Path(parent_ref["path"]) / MANIFEST_NAME)
        assert current.digest == parent_ref["digest"]
        stages.append((current.stage, current.snapshot))
    assert stages == [("clean", snapshot), ("crawl", snapshot)]
    assert Path(current.path).is_dir() and (Path(current.path) / "_SUCCESS").is_file()


@pytest.mark.slow
def test_stage_runs_nest_under_the_dag_run(trained):
    config, snapshot, client, _server = trained
    experiment = client.get_experiment_by_name("pretrain-sample-tiny")
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("pretrain.kind") == "dag_run"]
    assert parent.data.tags["airflow.run_id"] == DAG_RUN and parent.info.status == "FINISHED"
    children = {
        r.data.tags["pretrain.stage"]: r for r in runs if r.data.tags.get(PARENT_TAG) == parent.info.run_id
    }
    assert set(children) == {"train", "export", "evaluate", "report"}
    report_inputs = children["report"].inputs.dataset_inputs
    train_digest = DatasetRef.of(config, "train", snapshot).manifest().digest
    contexts = [
        ({t.key: t.value for t in d.tags}["mlflow.data.context"], d.dataset.digest) for d in report_inputs
    ]
    assert ("input", train_digest) in contexts


@pytest.mark.slow
def test_the_registered_version_generates_text_without_this_project(trained):
    """Loaded with mlflow.pyfunc (its code is the logged hf_generator.py, its weights the exported folder) in a
    fresh interpreter where `pipeline` cannot be imported (so the pyfunc needs nothing of this project), the registered version continues prompts greedily
    with the same tokens as our own model's KV-cache decoding."""
    config, snapshot, _client, server = trained
    report = DatasetRef.of(config, "report", snapshot).manifest()
    name, version = report.extra["registered_model"], report.extra["model_version"]
    prompts = ["The", "In the garden"]
    script = (
        # The venv has this project installed; None in sys.modules makes any `import pipeline` fail.
        "import json, sys\nsys.modules['pipeline'] = None\nimport mlflow\n"
        f"model = mlflow.pyfunc.load_model('models:/{name}/{version}')\n"
        f"print(json.dumps(model.predict({prompts!r}, params={{'max_new_tokens': 12}})))\n"
    )
    outside = Path(config.project.data_root).parent / "outside"
    outside.mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-I", "-c", script],
        cwd=outside,
        env={"MLFLOW_TRACKING_URI": server, "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    completions = json.loads(done.stdout.strip().splitlines()[-1])

    from tokenizers import Tokenizer

    from pipeline.model.inference import greedy_generate

    model = load_model(f"models:/{name}/{version}", tracking=server)
    tokenizer = Tokenizer.from_file(str(DatasetRef.of(config, "tokenize", snapshot).path / "tokenizer.json"))
    eos = tokenizer.token_to_id(config.bpe.eos_token)
    expected = [tokenizer.decode(greedy_generate(model, tokenizer.encode(p).ids, 12, eos)) for p in prompts]
    assert completions == expected


@pytest.mark.slow
def test_the_export_of_the_trained_checkpoint_loads_offline_with_our_logits(trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config, snapshot, _client, _server = trained
    export = DatasetRef.of(config, "export", snapshot)
    train = DatasetRef.of(config, "train", snapshot)
    assert export.run == train.run  # one exported folder per training run
    model = load_model_from(train)
    hf = AutoModelForCausalLM.from_pretrained(export.path, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(export.path, local_files_only=True)
    ids = torch.tensor([tokenizer("The bees are in the garden")["input_ids"]])
    with torch.no_grad():
        assert (model(ids).logits - hf(ids).logits).abs().max().item() <= 1e-4
    card = (export.path / "README.md").read_text()
    lineage = json.loads((export.path / "export.json").read_text())
    assert lineage["train_run"] == train.run and lineage["dataset_digests"]["tokenize"] in card
    assert train.manifest().extra["mlflow_run_id"] in card


@pytest.mark.slow
def test_evaluation_breaks_the_held_out_loss_down_and_the_generate_command_stops_at_end_of_text(trained):
    from pipeline.evaluate.generate import generate

    config, snapshot, client, _server = trained
    metrics = json.loads((DatasetRef.of(config, "evaluate", snapshot).path / "metrics.json").read_text())
    overall = metrics["overall"]
    assert overall["documents"] >= 1 and overall["tokens"] > 0
    for key in ("by_language", "by_host"):
        groups = metrics[key]
        assert sum(g["tokens"] for g in groups.values()) == overall["tokens"]
        weighted = sum(g["loss"] * g["tokens"] for g in groups.values()) / overall["tokens"]
        assert weighted == pytest.approx(overall["loss"])
    report = DatasetRef.of(config, "report", snapshot).manifest()
    (logged,) = client.get_metric_history(report.extra["mlflow_run_id"], "eval_loss")
    assert logged.value == pytest.approx(overall["loss"])

    argv = ["--snapshot", snapshot, "--set", f"project.data_root={config.project.data_root}"]
    results = generate([*argv, "--prompt", "The", "--temperature", "0", "--max-tokens", "40"])
    (result,) = results
    assert result["tokens"] <= 40 and "<|endoftext|>" not in result["completion"]
    sampled = generate([*argv, "--prompt", "The", "--temperature", "1", "--top-p", "0.9", "--seed", "3"])
    assert sampled == generate(
        [*argv, "--prompt", "The", "--temperature", "1", "--top-p", "0.9", "--seed", "3"]
    )


def load_model_from(train: DatasetRef):
    from pipeline.model.trained import TrainedRun

    return TrainedRun.of(train).model()


@pytest.mark.slow
def test_the_checkpoints_and_the_registered_model_are_logged_models_of_the_training_run(trained):
    """Through the server: torchrun's rank 0 made one LoggedModel per checkpoint, the report one for the
    exported model, and the registered version's source is that one."""
    config, snapshot, client, _server = trained
    report = DatasetRef.of(config, "report", snapshot).manifest()
    run = client.get_run(report.extra["mlflow_run_id"])
    models = client.search_logged_models(
        [run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'"
    )
    by_name = {model.name: model for model in models}
    assert sorted(by_name) == ["exported", "step-000004", "step-000008"]  # train.checkpoint_every=4
    assert {m.key for m in by_name["step-000008"].metrics} >= {"loss", "val_loss"}
    version = client.get_model_version(report.extra["registered_model"], report.extra["model_version"])
    assert version.source == f"models:/{by_name['exported'].model_id}"
    assert by_name["exported"].params["snapshots"] == f"sample/{snapshot}"
