"""Classifier configs fail early with the key named; model files are checked before Spark; preprocessing is
DCLM's. No Spark here."""

from __future__ import annotations

import random

import fasttext
import pytest

from pipeline.classify.models import check_fasttext_file, fasttext_scores, resolve
from pipeline.classify.preprocess import dclm, fasttext_tutorial, lowercase
from pipeline.config import load_config
from pipeline.core.config import ConfigError


def config(*overrides, root=None):
    return load_config(None, [*(f"project.data_root={root}",) * (root is not None), *overrides], environ={})


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("classify.models=[{name: a, path: x.bin, trained: t}]", "give either path or trained"),
        (
            "classify.models=[{name: a, path: x.bin, threshold: 0.5, top_fraction: 0.1}]",
            "top_fraction or thresholds",
        ),
        (
            "classify.models=[{name: a, path: x.bin}, {name: a, path: y.bin}]",
            r"\['a'\] appear more than once",
        ),
        ("classify.models=[{name: Bad-Name, path: x.bin}]", "classify.models.0.name"),
        ("classify.models=[{name: a, path: x.bin, top_fraction: 1.5}]", "top_fraction"),
        ("classifier_training.fasttext.dim=64", "dim must be a multiple of 10"),
        ("classifier_training.fasttext.threads=2", "classifier_training.fasttext.threads"),
        ("classifier_training.labelled=[{path: x.jsonl}]", r"labelled\[0\] needs score_field"),
        ("classifier_training.positives=[{stage: dedup}]", "needs a snapshot"),
        ("classifier_training.min_examples_per_class=0", "classifier_training.min_examples_per_class"),
        ("classifier_training.min_heldout_per_class=0", "classifier_training.min_heldout_per_class"),
        (
            "classifier_training.min_examples_per_class=200000",
            r"min_examples_per_class \(200000\) is above max_examples_per_class \(100000\)",
        ),
        (
            "classifier_training.min_heldout_per_class=101",
            r"min_heldout_per_class \(101\) is above min_examples_per_class",
        ),
        ("decontaminate.min_ngram_size=20", "min_ngram_size must not exceed ngram_size"),
        ("decontaminate.sets=[{name: x, kind: lm_eval}]", "needs tasks"),
    ],
)
def test_bad_settings_fail_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        config(override)


def test_preprocessing_is_dclms_by_default():
    text = "  First line.\nSecond   line!\r\nThird\n\n"
    assert dclm(text) == "First line. Second   line! Third"
    assert lowercase(text) == "first line. second   line! third"
    assert fasttext_tutorial("Hello, World! (it's)") == "hello , world ! ( it ' s )"
    assert "\n" not in dclm("a\u2028b\x0bc\rd")


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    rng = random.Random(0)
    lines = [
        f"__label__{label} " + " ".join(f"{label}{rng.randrange(50)}" for _ in range(12))
        for label in ("hq", "cc", "other") * 100
    ]
    (folder / "train.txt").write_text("\n".join(lines) + "\n")
    model = fasttext.train_supervised(str(folder / "train.txt"), thread=10, verbose=0, epoch=3)
    model.save_model(str(folder / "model.bin"))
    return folder / "model.bin", model


def test_labels_are_read_from_the_file_header(small_model, tmp_path):
    path, model = small_model
    assert sorted(check_fasttext_file(path).labels) == sorted(model.labels)
    (tmp_path / "not-a-model.bin").write_bytes(b"\x00" * 64)
    with pytest.raises(ConfigError, match="is not a fastText model file"):
        check_fasttext_file(tmp_path / "not-a-model.bin")


def test_a_model_is_resolved_checked_and_digested_before_spark(small_model, tmp_path):
    path, _ = small_model
    good = config(f"classify.models=[{{name: q, path: {path}, label: __label__cc}}]", root=tmp_path)
    resolved = resolve(good.classify.models[0], good)
    assert resolved.kind == "fasttext" and resolved.preprocess == "dclm" and len(resolved.sha256) == 64
    assert set(resolved.labels) == {"__label__hq", "__label__cc", "__label__other"}
    wrong = config(f"classify.models=[{{name: q, path: {path}, label: __label__good}}]", root=tmp_path)
    with pytest.raises(ConfigError, match=r"classify.models\[q\].label: '__label__good' is not a label"):
        resolve(wrong.classify.models[0], wrong)
    missing = config(f"classify.models=[{{name: q, path: {tmp_path / 'gone.bin'}}}]", root=tmp_path)
    with pytest.raises(ConfigError, match=r"classify.models\[q\]: no model file"):
        resolve(missing.classify.models[0], missing)
    untrained = config("classify.models=[{name: q, trained: nothing}]", root=tmp_path)
    with pytest.raises(ConfigError, match="no complete train_classifier output"):
        resolve(untrained.classify.models[0], untrained)


def test_batch_scores_equal_single_predictions(small_model):
    _, model = small_model
    texts = ["hq1 hq2 hq3", "cc4 cc5", "", "other7\nhq1"]
    scores = fasttext_scores(model, texts, "__label__hq", "dclm")
    for text, score in zip(texts, scores, strict=True):
        labels, probabilities = model.predict(dclm(text), k=-1)
        assert score == float(probabilities[list(labels).index("__label__hq")])


def test_train_classifier_without_examples_fails_with_one_line(tmp_path, capsys):
    from pipeline.classify.training.__main__ import main
    from pipeline.core.cli import run_cli

    argv = [
        "--snapshot",
        "m1",
        "--set",
        f"project.data_root={tmp_path}",
        "--set",
        "tracking.stage_runs=false",
    ]
    assert run_cli(main, argv) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: classifier_training: give positives and negatives (reference text against a corpus sample), or labelled"
    )
