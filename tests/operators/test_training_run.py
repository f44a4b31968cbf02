"""`pretrain`'s first task names the training run after the DAG run, so a sweep of DAG runs on one snapshot
trains (and reports) one run each, and every task of a DAG run, retries included, works on the same one."""

from operators.training import resolve_training_run, training_run_id
from pipeline.config import load_config
from pipeline.core.storage import validate_run_id

DAG_RUN = "manual__2026-12-01T10:15:30.123456+00:00"


def test_the_training_run_is_named_after_the_dag_run(tmp_path):
    params = {"snapshot": "demo", "overrides": [f"project.data_root={tmp_path}", "train.lr=0.001"]}
    resolved = resolve_training_run(params, {}, dag_run_id=DAG_RUN)
    config = load_config(resolved["config_path"], environ={})
    assert config.train.run_id == training_run_id(DAG_RUN) == "manual__2026-12-01T10-15-30.123456-00-00"
    assert validate_run_id(config.train.run_id)
    # The name says where the output goes, not how it is trained: the hash is that of the settings.
    assert resolved["config_hash"] == config.hash == load_config(None, params["overrides"], environ={}).hash


def test_a_run_named_in_the_settings_is_kept(tmp_path):
    params = {"snapshot": "demo", "overrides": [f"project.data_root={tmp_path}", "train.run_id=lr-1e-3"]}
    resolved = resolve_training_run(params, {}, dag_run_id=DAG_RUN)
    assert load_config(resolved["config_path"], environ={}).train.run_id == "lr-1e-3"


def test_the_forms_pipeline_fields_reach_the_config(tmp_path):
    params = {
        "snapshot": "demo",
        "overrides": [f"project.data_root={tmp_path}", "model.overrides={num_hidden_layers: 4}"],
        "pipeline_stages": 2,
        "microbatches": 4,
        "pipeline_schedule": "interleaved_1f1b",
        "stages_per_rank": 2,
    }
    train = load_config(resolve_training_run(params, {}, dag_run_id=DAG_RUN)["config_path"], environ={}).train
    assert (train.pipeline_stages, train.microbatches, train.pipeline_schedule, train.stages_per_rank) == (
        2,
        4,
        "interleaved_1f1b",
        2,
    )
