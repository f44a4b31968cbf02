import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import PipelineConfig, load_config
from pipeline.core.config import ConfigError, flatten


def test_defaults_validate_and_hash_is_stable():
    first, second = load_config(environ={}), load_config(environ={})
    assert first.hash == second.hash
    assert len(first.hash) == 16
    assert first.project.data_root.endswith("/data")


def test_yaml_then_env_then_cli_precedence(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text("train:\n  steps: 7\n  lr: 0.5\nproject:\n  corpus: web\n")
    config = load_config(
        path, ["train.steps=9"], environ={"PRETRAIN__TRAIN__LR": "0.25", "PRETRAIN__TRAIN__STEPS": "8"}
    )
    assert config.train.steps == 9  # --set beats env
    assert config.train.lr == 0.25  # env beats file
    assert config.project.corpus == "web"  # file beats default


def test_hash_changes_with_any_value():
    assert load_config(environ={}).hash != load_config(overrides=["train.steps=41"], environ={}).hash


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("train.steps=abc", "train.steps"),
        ("train.stepz=3", "train.stepz"),
        ("nosection.key=1", "nosection"),
        ("train.precision=fp8", "train.precision"),
        ("model.preset=huge", "model.preset"),
        ("model.overrides.num_layerz=2", "model.overrides"),
        ("model.overrides.hidden_size=130", "model"),
        ("project.corpus=bad/name", "project.corpus"),
        ("clean.min_chars=5000000", "clean"),
        ("train.lr=.inf", "train.lr"),
        ("train.lr=.nan", "train.lr"),
        ("dedup.threshold=.nan", "dedup.threshold"),
        ("train.seq_len=100000000", "train.seq_len"),
        ("train.steps=12345678901234567890123", "train.steps"),
        ("crawl.download_delay=.inf", "crawl.download_delay"),
    ],
)
def test_bad_value_names_the_key(override: str, names: str):
    with pytest.raises(ConfigError) as error:
        load_config(overrides=[override], environ={})
    assert names in str(error.value)


def test_bad_env_var_names_its_source():
    with pytest.raises(ConfigError, match=r"train\.nope.*env PRETRAIN__TRAIN__NOPE"):
        load_config(environ={"PRETRAIN__TRAIN__NOPE": "1"})


def test_missing_and_malformed_files(tmp_path: Path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.yaml", environ={})
    broken = tmp_path / "broken.yaml"
    broken.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken, environ={})
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(scalar, environ={})


@pytest.mark.parametrize(
    ("override", "suggestion"),
    [
        ("train.stpes=10", "'steps'"),
        ("trian.steps=10", "'train'"),
        ("clean.c4.filter_lorem=1", "'filter_lorem_ipsum'"),
    ],
)
def test_a_misspelt_key_gets_a_did_you_mean(override: str, suggestion: str):
    with pytest.raises(ConfigError, match=f"did you mean {suggestion}"):
        load_config(overrides=[override], environ={})


def test_a_renamed_section_is_refused_naming_the_new_one(tmp_path: Path):
    """`classifier` (training one) read as `classify` (the stage): renamed, and the old name is refused from
    every source with the key to write instead."""
    expected = r"classifier.positives: renamed to classifier_training.positives; set that key instead"
    with pytest.raises(ConfigError, match=expected + r" \(from --set\)"):
        load_config(overrides=["classifier.positives=[]"], environ={})
    with pytest.raises(ConfigError, match=expected + r" \(from env PRETRAIN__CLASSIFIER__POSITIVES\)"):
        load_config(environ={"PRETRAIN__CLASSIFIER__POSITIVES": "[]"})
    old = tmp_path / "old.yaml"
    old.write_text("classifier:\n  positives: []\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=expected):
        load_config(old, environ={})
    assert load_config(overrides=["classifier_training.min_examples_per_class=50"], environ={})


def test_the_tokenizer_section_is_bpe_and_the_old_name_is_refused_naming_the_new_one(tmp_path: Path):
    """`tokenizer` (the BPE's training, normalisation and special tokens) read as `tokenize` (the stage, whose
    own `tokenize.tokenizer` picks which tokenizer): renamed `bpe`, the old name refused from every source."""
    expected = r"tokenizer.vocab_size: renamed to bpe.vocab_size; set that key instead"
    with pytest.raises(ConfigError, match=expected + r" \(from --set\)"):
        load_config(overrides=["tokenizer.vocab_size=4096"], environ={})
    with pytest.raises(ConfigError, match=expected + r" \(from env PRETRAIN__TOKENIZER__VOCAB_SIZE\)"):
        load_config(environ={"PRETRAIN__TOKENIZER__VOCAB_SIZE": "4096"})
    old = tmp_path / "old.yaml"
    old.write_text("tokenizer:\n  vocab_size: 4096\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=expected):
        load_config(old, environ={})
    config = load_config(overrides=["bpe.vocab_size=4096", "tokenize.tokenizer=snapshot"], environ={})
    assert (config.bpe.vocab_size, config.tokenize.tokenizer) == (4096, "snapshot")


def test_a_key_far_from_any_gets_no_guess():
    with pytest.raises(ConfigError) as error:
        load_config(overrides=["train.zzzzzz=1"], environ={})
    assert "did you mean" not in str(error.value) and "known: [" in str(error.value)


def test_a_config_file_that_is_not_utf8_is_one_clear_error(tmp_path: Path):
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("project:\n  corpus: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"is not UTF-8 text"):
        load_config(latin1, environ={})


def test_override_without_equals_is_rejected():
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        load_config(overrides=["train.steps"], environ={})


def test_round_trip_through_yaml(tmp_path: Path):
    config = load_config(overrides=["train.steps=5", "crawl.seeds=[http://a.example/]"], environ={})
    path = tmp_path / "resolved.yaml"
    path.write_text(config.to_yaml())
    assert load_config(path, environ={}).hash == config.hash


def test_a_free_form_mapping_in_a_config_file_keeps_its_dotted_keys(tmp_path: Path):
    """spark.extra_conf's keys are Spark's own dotted names: a config file sets them as written (they were
    split at the dots into sections, so no file could set one), and the resolved config reloads."""
    extra = {"spark.eventLog.enabled": "true", "spark.sql.ansi.enabled": "false"}
    config = load_config(overrides=[f"spark.extra_conf={json.dumps(extra)}"], environ={})
    path = tmp_path / "resolved.yaml"
    path.write_text(config.to_yaml())
    again = load_config(path, environ={})
    assert again.spark.extra_conf == extra and again.hash == config.hash
    path.write_text("spark:\n  master: local[1]\n  extra_conf:\n    spark.eventLog.enabled: 'true'\n")
    written = load_config(path, overrides=["spark.shuffle_partitions=3"], environ={})
    assert written.spark.extra_conf == {"spark.eventLog.enabled": "true"}
    assert (written.spark.master, written.spark.shuffle_partitions) == ("local[1]", 3)
    path.write_text("spark:\n  extra_cnf:\n    spark.x: 'y'\n")
    with pytest.raises(ConfigError, match=r"spark\.extra_cnf.*did you mean 'extra_conf'"):
        load_config(path, environ={})


@given(st.integers(min_value=1, max_value=10**9), st.floats(min_value=1e-9, max_value=10, allow_nan=False))
def test_numeric_overrides_round_trip(steps: int, lr: float):
    config = load_config(overrides=[f"train.steps={steps}", f"train.lr={lr!r}"], environ={})
    assert config.train.steps == steps
    assert config.train.lr == pytest.approx(lr)
    assert flatten(config.to_dict())["train.steps"] == steps


def test_flat_covers_every_leaf():
    flat = PipelineConfig().flat()
    assert flat["train.steps"] == 40
    assert all(not isinstance(value, dict) or value == {} for value in flat.values())


BILLION_LAUGHS = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)]
)


def test_a_yaml_bomb_in_a_config_file_is_refused_before_it_expands(tmp_path: Path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(
        f"train:\n  extra:\n{''.join('    ' + line + chr(10) for line in BILLION_LAUGHS.splitlines())}"
    )
    with pytest.raises(ConfigError, match=r"YAML aliases \(\*name\) are not accepted"):
        load_config(bomb, environ={})


def test_a_yaml_bomb_in_an_override_is_refused():
    flow = (
        "[&a [x, x, x, x, x, x, x, x], &b [*a, *a, *a, *a, *a, *a, *a, *a], [*b, *b, *b, *b, *b, *b, *b, *b]]"
    )
    with pytest.raises(ConfigError, match="aliases"):
        load_config(overrides=[f"clean.languages={flow}"], environ={})


def test_an_error_echoes_a_bounded_part_of_a_huge_value():
    huge = "[" + ", ".join(["xx"] * 50_000) + "]"
    with pytest.raises(ConfigError) as error:
        load_config(overrides=[f"clean.languages={huge}", f"crawl.seeds={huge}"], environ={})
    assert len(str(error.value)) < 3000
    assert "chars)" in str(error.value)


# --- hostile config: depth, duplicate keys, non-finite numbers, credentials in URLs ---------------------

DEEP = 3000  # a few thousand levels: PyYAML's recursive composer used to end in a RecursionError traceback


def test_a_deeply_nested_config_file_is_one_error_naming_where(tmp_path: Path):
    path = tmp_path / "deep.yaml"
    path.write_text("model:\n  overrides:\n    x: " + "[" * DEEP + "]" * DEEP + "\n")
    with pytest.raises(ConfigError) as error:
        load_config(path, environ={})
    message = str(error.value)
    assert "nested more than 32 levels deep" in message and "model.overrides.x[0][0]" in message
    assert str(path) in message and len(message) < 500


def test_a_deeply_nested_block_mapping_is_refused_too(tmp_path: Path):
    path = tmp_path / "deep.yaml"
    path.write_text("".join(f"{'  ' * level}k{level}:\n" for level in range(40)) + "  " * 40 + "v: 1\n")
    with pytest.raises(ConfigError, match=r"k0\.k1\.k2.*nested more than 32 levels deep \(line \d+\)"):
        load_config(path, environ={})


def test_a_deeply_nested_override_or_env_value_names_its_key():
    deep = "[" * DEEP + "]" * DEEP
    with pytest.raises(ConfigError, match=r"^model\.overrides \(from --set\): .*nested more than 32"):
        load_config(overrides=[f"model.overrides={deep}"], environ={})
    with pytest.raises(ConfigError, match=r"^clean\.languages \(from env PRETRAIN__CLEAN__LANGUAGES\)"):
        load_config(environ={"PRETRAIN__CLEAN__LANGUAGES": deep})


def test_the_cli_answers_a_deep_config_with_one_line_and_exit_2(tmp_path: Path):
    import subprocess
    import sys

    deep = "{a: " * DEEP + "1" + "}" * DEEP
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "config", "--set", f"model.overrides={deep}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert "RecursionError" not in done.stderr


def test_a_duplicate_key_is_refused_naming_both_lines(tmp_path: Path):
    path = tmp_path / "twice.yaml"
    path.write_text("train:\n  steps: 5\n  lr: 0.1\n  steps: 7\n")
    with pytest.raises(ConfigError, match=r"train\.steps: duplicate key 'steps' at line 2 and line 4"):
        load_config(path, environ={})
    path.write_text("train: {steps: 5}\nproject: {}\ntrain: {lr: 0.1}\n")
    with pytest.raises(ConfigError, match="duplicate key 'train' at line 1 and line 3"):
        load_config(path, environ={})


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_non_finite_numbers_are_refused_in_free_form_settings(value: str):
    with pytest.raises(ConfigError, match=r"model\.overrides\.rope_theta: .* is not a finite number"):
        load_config(overrides=[f"model.overrides={{rope_theta: {value}}}"], environ={})
    with pytest.raises(ConfigError, match=r"model\.overrides\.initializer_range: .*not a finite.*from env"):
        load_config(environ={"PRETRAIN__MODEL__OVERRIDES": f"{{initializer_range: {value}}}"})


@pytest.mark.parametrize(
    "override",
    [
        "logging.elasticsearch_url=https://elastic:s3cret@logs.example:9200",
        "tracking.mlflow_tracking_uri=http://user:pw@mlflow.example",
        "crawl.seeds=[https://a.example/, http://me@b.example/]",
    ],
)
def test_credentials_inside_a_url_setting_are_refused_and_never_echoed(override: str):
    with pytest.raises(ConfigError, match="carries credentials") as error:
        load_config(overrides=[override], environ={})
    assert "s3cret" not in str(error.value) and "pw@" not in str(error.value)
    assert "***@" in str(error.value)


@pytest.mark.parametrize("data_root", ["/proc/self/data", "/proc", "/sys/kernel"])
def test_a_data_root_inside_a_kernel_interface_is_one_error(data_root: str):
    with pytest.raises(ConfigError, match=r"project\.data_root: .*kernel interface"):
        load_config(overrides=[f"project.data_root={data_root}"], environ={})


def test_a_data_root_below_a_regular_file_is_one_error(tmp_path: Path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"project\.data_root: .* cannot be a folder: .*/file is a file"):
        load_config(overrides=[f"project.data_root={tmp_path / 'file' / 'data'}"], environ={})
    with pytest.raises(ConfigError, match="is a file"):
        load_config(overrides=[f"project.data_root={tmp_path / 'file'}"], environ={})


def test_urls_from_the_environment_are_recorded_without_their_userinfo():
    """Credentials may come from the environment ($MLFLOW_TRACKING_URI, $ELASTICSEARCH_URL); logs, the
    report's manifest and mlflow_run.json show those URLs through redact_url."""
    from pipeline.core.config import redact_url

    assert redact_url("https://elastic:s3cret@logs.example:9200/x") == "https://***@logs.example:9200/x"
    assert redact_url("https://token@mlflow.example/") == "https://***@mlflow.example/"
    assert redact_url("sqlite:////data/mlflow.db") == "sqlite:////data/mlflow.db"
    assert redact_url("http://a.example/p?next=x@y") == "http://a.example/p?next=x@y"
