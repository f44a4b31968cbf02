"""The `pretrain` form: every field sets a config key that exists (or is one of the run's inputs), a field with
fixed choices offers exactly the config's, and its typed values reach the config as they are."""

import pytest

from operators.training import RUN_FIELDS, TRAINING_FORM, form_params, form_values
from pipeline.config import config_key, key_choices, load_config


@pytest.mark.parametrize("entry", TRAINING_FORM, ids=lambda entry: entry.name)
def test_every_form_field_sets_a_config_key_that_exists(entry):
    if entry.key is None:
        assert entry.name in RUN_FIELDS, f"{entry.name} sets no config key and is not one of the run's inputs"
    else:
        assert config_key(entry.key) is not None  # a ConfigError names an unknown key


def test_the_runs_inputs_are_the_only_fields_without_a_key():
    assert {entry.name for entry in TRAINING_FORM if entry.key is None} == set(RUN_FIELDS)


@pytest.mark.parametrize(
    "entry", [entry for entry in TRAINING_FORM if entry.key], ids=lambda entry: entry.name
)
def test_a_fields_choices_are_the_configs(entry):
    param = form_params()[entry.name]
    choices = key_choices(entry.key)
    if choices is None:
        assert "enum" not in param
    else:
        assert [choice for choice in param["enum"] if choice is not None] == list(choices)
        assert param["default"] is None or param["default"] in choices


def test_typed_values_set_their_keys_as_they_are():
    params = {
        "steps": 7,
        "launcher": "kubernetes",
        "mlflow_experiment": "2026",  # stays a string: no text is parsed on the way
        "preset": None,  # left empty: the config's value stands
        "precision": "",
        "mixture": [],
        "snapshot": "s1",  # a run input, no config key
    }
    values = form_values(params)
    assert values == {"train.steps": 7, "train.launcher": "kubernetes", "tracking.experiment": "2026"}
    config = load_config(None, values=values, environ={})
    assert (config.train.steps, config.train.launcher, config.tracking.experiment) == (
        7,
        "kubernetes",
        "2026",
    )
    # How a run is launched is not what it trains: both launchers of the same settings share one hash.
    assert config.hash == load_config(None, values={**values, "train.launcher": "local"}, environ={}).hash
