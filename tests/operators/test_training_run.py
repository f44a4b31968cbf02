"""`pretrain`'s first task names the training run after the DAG run, so a sweep of DAG runs on one snapshot
trains (and reports) one run each, and every task of a DAG run, retries included, works on the same one."""

import pytest

from operators.training import resolve_training_run, training_run_id
from pipeline.config import load_config
from pipeline.core.config import ConfigError
from pipeline.core.storage import validate_run_id

DAG_RUN = "manual__2026-12-01T10:15:30.123456+00:00"


def test_the_training_run_is_named_after_the_dag_run(tmp_path):
    params = {"snapshot": "demo", "overrides": [f"project.data_root={tmp_path}", "train.lr=0.001"]}
    resolved = resolve_training_run(params, {}, dag_run_id=DAG_RUN)
    config = load_config(resolved["config_path"], environ={})
    assert config.train.run_id == training_run_id(DAG_RUN) == "manual__2026-12-01T10-15-30.123456-00-00"
    assert validate_run_id(config.train.run_id)
    # The name says where the output goes, not how it is trained: the hash is that of the settings.
    assert config.hash == load_config(None, params["overrides"], environ={}).hash


def test_a_run_named_in_the_settings_is_kept(tmp_path):
    params = {"snapshot": "demo", "overrides": [f"project.data_root={tmp_path}", "train.run_id=lr-1e-3"]}
    resolved = resolve_training_run(params, {}, dag_run_id=DAG_RUN)
    assert load_config(resolved["config_path"], environ={}).train.run_id == "lr-1e-3"


def test_the_forms_pipeline_fields_reach_the_config(tmp_path):
    params = {
        "snapshot": "demo",
        "overrides": [f"project.data_root={tmp_path}", "model.overrides={num_hidden_layers: 4}"],
        "pp_degree": 2,
        "pp_microbatches": 4,
        "pp_schedule": "interleaved_1f1b",
        "pp_virtual_stages": 2,
    }
    train = load_config(resolve_training_run(params, {}, dag_run_id=DAG_RUN)["config_path"], environ={}).train
    assert (train.pp_degree, train.pp_microbatches, train.pp_schedule, train.pp_virtual_stages) == (
        2,
        4,
        "interleaved_1f1b",
        2,
    )


def test_the_forms_old_pipeline_field_names_are_refused_naming_the_new_ones(tmp_path):
    params = {"snapshot": "demo", "overrides": [f"project.data_root={tmp_path}"], "pipeline_stages": 2}
    with pytest.raises(ConfigError, match="form field 'pipeline_stages' is now 'pp_degree'"):
        resolve_training_run(params, {}, dag_run_id=DAG_RUN)


def publish_tokens(config, corpus: str, snapshot: str) -> None:
    from tests.train.support import write_token_corpus

    write_token_corpus(config, snapshot, documents=30, seed=len(snapshot), corpus=corpus, tokenizer_seed=7)


def test_the_forms_mixture_reaches_the_config_and_is_resolved_before_training(tmp_path):
    import pytest

    from pipeline.core.config import ConfigError
    from pipeline.data.mixture import MixtureError

    base = load_config(None, [f"project.data_root={tmp_path}"], environ={})
    publish_tokens(base, "web", "d1")
    publish_tokens(base, "books", "v1")
    mixture = [{"corpus": "web", "snapshots": "all", "weight": 3}, {"corpus": "books", "weight": 1}]
    params = {"overrides": [f"project.data_root={tmp_path}"], "mixture": mixture}
    resolved = resolve_training_run(params, {}, dag_run_id=DAG_RUN)
    config = load_config(resolved["config_path"], environ={})
    assert [(s.corpus, s.snapshots, s.weight) for s in config.data.mixture] == [
        ("web", "all", 3.0),
        ("books", "all", 1.0),
    ]
    assert resolved["snapshot"]  # the run's folder: today's date when no snapshot is given
    # What the JSON schema cannot say, the config's validation does, naming the key...
    bad_grammar = {**params, "mixture": [{"corpus": "web", "snapshots": "last:0"}]}
    with pytest.raises(ConfigError, match=r"data\.mixture"):
        resolve_training_run(bad_grammar, {}, dag_run_id=DAG_RUN)
    # ...and resolving it against the data root, naming the source.
    unknown = {**params, "mixture": [{"corpus": "news", "weight": 1}]}
    with pytest.raises(MixtureError, match="unknown corpus 'news'"):
        resolve_training_run(unknown, {}, dag_run_id=DAG_RUN)


def test_the_scheduled_variant_trains_on_every_snapshot_of_the_events_corpus(tmp_path, monkeypatch):
    import operators.training
    from pipeline.data.mixture import training_mixture
    from pipeline.train.launcher.launch import training_inputs

    base = load_config(None, [f"project.data_root={tmp_path}", "project.corpus=web"], environ={})
    for snapshot in ("2026-11-01", "2026-11-02"):
        publish_tokens(base, "web", snapshot)
    loads = []

    def counted_load_config(*args, **kwargs):
        loads.append(args)
        return load_config(*args, **kwargs)

    monkeypatch.setattr(operators.training, "load_config", counted_load_config)
    event = {"snapshot": "2026-11-02", "overrides": [f"project.data_root={tmp_path}", "project.corpus=web"]}
    resolved = resolve_training_run({}, event, dag_run_id=DAG_RUN, every_snapshot=True)
    assert len(loads) == 1  # the config is read once, its mixture added to it
    config = load_config(resolved["config_path"], environ={})
    assert resolved["snapshot"] == "2026-11-02"
    assert [(s.corpus, s.snapshots) for s in config.data.mixture] == [("web", "all")]
    # Resolved once, into the frozen file: a snapshot published later is not this run's.
    frozen = config.data.resolved_mixture
    assert frozen is not None and [s.snapshots for s in frozen.sources] == [["2026-11-01", "2026-11-02"]]
    publish_tokens(base, "web", "2026-11-03")
    assert training_mixture(config, resolved["snapshot"]).sources[0].snapshots == ["2026-11-01", "2026-11-02"]
    assert [ref.snapshot for ref in training_inputs(config, resolved["snapshot"], "tokenize")] == [
        "2026-11-01",
        "2026-11-02",
    ]
    # Without every_snapshot the same event trains its own snapshot, as before.
    single = resolve_training_run({}, event, dag_run_id=DAG_RUN)
    assert load_config(single["config_path"], environ={}).data.mixture is None


def test_the_training_tasks_and_the_ranks_read_the_frozen_file_as_it_is(tmp_path, monkeypatch):
    from pathlib import Path

    import pytest
    from airflow.sdk.exceptions import AirflowFailException

    from operators.train_operator import TrainOperator
    from pipeline.train.launcher.launch import prepare_torchrun, training_inputs

    base = load_config(None, [f"project.data_root={tmp_path}"], environ={})
    publish_tokens(base, base.project.corpus, "demo")
    params = {"snapshot": "demo", "overrides": [f"project.data_root={tmp_path}"], "steps": 3}
    frozen = Path(resolve_training_run(params, {}, dag_run_id=DAG_RUN)["config_path"])
    text = frozen.read_text()
    # The worker's environment was applied once, when the run was resolved; the train task does not reapply it.
    monkeypatch.setenv("PRETRAIN__TRAIN__STEPS", "99")
    op = TrainOperator(
        task_id="train", snapshot="demo", config_path=str(frozen), overrides=[], frozen_config=True
    )
    config = op.resolved_config()
    assert config.train.steps == 3 and config.to_yaml() == text
    # torchrun's ranks get the same file, untouched, and no second one is written beside it.
    command = prepare_torchrun(config, training_inputs(config, "demo", "tokenize"), "demo", frozen)
    assert command[command.index("--config") + 1] == str(frozen) and frozen.read_text() == text
    assert sorted(path.name for path in frozen.parent.glob("*.yaml")) == [frozen.name]
    # A frozen file takes no overrides on top, and must name the run its ranks train.
    with pytest.raises(AirflowFailException, match="as it is"):
        TrainOperator(
            task_id="train", config_path=str(frozen), overrides=["train.steps=4"], frozen_config=True
        ).resolved_config()
    with pytest.raises(AirflowFailException, match=r"train\.run_id"):
        op._with_run(config, "another-run")


def test_the_train_operators_launch_arguments_are_config_keys_now():
    import pytest

    from operators.train_operator import TrainOperator

    for argument, key in [("launcher", "train.launcher"), ("nproc_per_node", "train.nproc_per_node")]:
        with pytest.raises(TypeError, match=rf"config key {key} now"):
            TrainOperator(task_id="train", **{argument: "kubernetes"})
