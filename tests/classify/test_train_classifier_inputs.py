"""Classifier training trusts nothing it reads: unusable lines are skipped and counted with their reason, a
source with no usable line, too few examples of a class or too few held out for the figures end the run as
one `error:` line (exit 2) before any training, and nothing is published.

One Spark session for the module; fastText kept tiny (10 dimensions, 1,000 buckets)."""

from __future__ import annotations

import json
import math
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.classify.training import job as training_job
from pipeline.classify.training.__main__ import main as train_classifier_main
from pipeline.core.cli import run_cli
from pipeline.core.spark import spark_session
from pipeline.core.storage import DatasetRef, StageFailure
from pipeline.documents.sources import judge_json_line
from tests.classify.texts import junk_documents, wikipedia_extracts
from tests.conftest import make_config

pytestmark = pytest.mark.slow
TINY = [
    "classifier_training.fasttext.dim=10",
    "classifier_training.fasttext.bucket=1000",
    "classifier_training.fasttext.epoch=2",
    "tracking.stage_runs=false",
]
# Good lines and bad ones, each bad one with the reason it is skipped.
BAD_LINES = {
    '{"text": 1}': "'text' is not a string",
    '{"title": "no text here"}': "no 'text'",
    '{"text": null}': "no 'text'",
    '{"text": "   "}': "empty 'text'",
    "[1, 2]": "not a JSON object",
    '"just a string"': "not a JSON object",
    '{"text": "cut off': "not JSON",
    "": "blank line",
}


def untrained(*args):
    pytest.fail("the model was trained")


def jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    return path


@pytest.fixture(scope="module")
def texts():
    wiki = list(wikipedia_extracts())
    random.Random(5).shuffle(wiki)
    return {"good": wiki[:150], "junk": junk_documents(150, seed=9)}


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    return spark_session(make_config(tmp_path_factory.mktemp("spark")), "test-train-classifier-inputs")


def train(tmp_path, capsys, *overrides):
    """`pretrain train_classifier --snapshot m`: (exit status, stderr, the output's ref)."""
    settings = [f"project.data_root={tmp_path / 'data'}", "logging.console=false", *TINY, *overrides]
    argv = ["--snapshot", "m", *[arg for item in settings for arg in ("--set", item)]]
    code = run_cli(train_classifier_main, argv)
    config = make_config(tmp_path / "data")
    return code, capsys.readouterr().err, DatasetRef.of(config, "train_classifier", "m")


def refused(code, err, output, *fragments):
    assert code == 2, err[-3000:]
    # The stage announces its data root first; then one error line, and no traceback.
    lines = err.splitlines()
    assert lines[-1].startswith("error: ") and sum(line.startswith("error:") for line in lines) == 1, err[
        -3000:
    ]
    assert "Traceback" not in err, err[-3000:]
    for fragment in fragments:
        assert fragment in err, err
    assert not output.is_complete() and not output.path.exists(), "a refused run publishes nothing"


def test_positives_with_no_usable_line_are_one_error_naming_the_file_and_line(
    spark, tmp_path, capsys, texts, monkeypatch
):
    positives = tmp_path / "positives.jsonl"
    positives.write_text('{"text": 1}\n{"title": "a page without its text"}\n[1, 2]\n')
    negatives = jsonl(tmp_path / "negatives.jsonl", texts["junk"])
    monkeypatch.setattr(training_job, "train_fasttext", untrained)
    code, err, output = train(
        tmp_path,
        capsys,
        f"classifier_training.positives=[{{path: {positives}}}]",
        f"classifier_training.negatives=[{{path: {negatives}}}]",
    )
    refused(
        code,
        err,
        output,
        "classifier_training.positives[0]",
        "no usable document",
        "3 unusable",
        f"{positives}:1: 'text' is not a string",
    )


def test_a_source_mostly_unusable_is_refused_above_its_share_and_read_below_it(spark, tmp_path, texts):
    """A wrong field name in most lines is a mistake, not a few damaged lines: more than
    ``max_unusable_share`` of a source unusable is an error naming the source, its share and first bad line."""
    rng = random.Random(11)
    good = [json.dumps({"text": t}) for t in texts["good"][:30]]
    bad = [json.dumps({"body": t}) for t in texts["good"][30:50]]
    lines = good + bad
    rng.shuffle(lines)
    positives = tmp_path / "positives.jsonl"
    positives.write_text("\n".join(lines) + "\n")
    negatives = jsonl(tmp_path / "negatives.jsonl", texts["junk"])
    sources = [
        f"classifier_training.positives=[{{path: {positives}}}]",
        f"classifier_training.negatives=[{{path: {negatives}}}]",
    ]
    config = make_config(tmp_path / "data", *sources)
    with pytest.raises(StageFailure) as refusal:
        training_job.read_examples(spark, config.classifier_training, config)
    first_bad = 1 + next(i for i, line in enumerate(lines) if '"body"' in line)
    message = str(refusal.value)
    assert "classifier_training.positives[0]" in message and "20 unusable" in message, message
    assert "of 50, 40%, more than classifier_training.max_unusable_share (25%)" in message, message
    assert f"{positives}:{first_bad}: " in message, message

    config = make_config(tmp_path / "data", *sources, "classifier_training.max_unusable_share=0.4")
    _, report = training_job.read_examples(spark, config.classifier_training, config)
    assert report["classifier_training.positives[0]"][str(positives)]["kept"] == 30


def test_an_empty_source_is_one_error_naming_it(spark, tmp_path, capsys, texts):
    positives = tmp_path / "positives.jsonl"
    positives.write_text("")
    negatives = jsonl(tmp_path / "negatives.jsonl", texts["junk"])
    code, err, output = train(
        tmp_path,
        capsys,
        f"classifier_training.positives=[{{path: {positives}}}]",
        f"classifier_training.negatives=[{{path: {negatives}}}]",
    )
    refused(code, err, output, "classifier_training.positives[0]", str(positives), "it holds none")


def labelled_lines(texts, bad: list[str]) -> str:
    good = [json.dumps({"text": t, "score": 4}) for t in texts["good"][:60]]
    good += [json.dumps({"text": t, "score": 1.5}) for t in texts["junk"][:60]]
    return "\n".join([*good[:30], *bad, *good[30:]]) + "\n"


def test_labelled_scores_that_are_strings_or_nan_are_skipped_and_counted(spark, tmp_path, capsys, texts):
    labelled = tmp_path / "labelled.jsonl"
    bad = [
        json.dumps({"text": "a string for a score", "score": "high"}),
        json.dumps({"text": "a score that is not a number at all", "score": math.nan}),  # NaN
    ]
    labelled.write_text(labelled_lines(texts, bad))
    code, err, output = train(
        tmp_path,
        capsys,
        f"classifier_training.labelled=[{{path: {labelled}, score_field: score}}]",
        "classifier_training.min_examples_per_class=20",
        "classifier_training.min_heldout_per_class=2",
        "classifier_training.heldout_fraction=0.3",
    )
    assert code == 0, err[-3000:]
    manifest = output.manifest()
    skipped = {"'score' is not a number": 1, "'score' is not finite": 1}
    assert manifest.extra["sources"] == {
        "classifier_training.labelled[0]": {str(labelled): {"kept": 120, "skipped": skipped}}
    }
    examples = manifest.counters["examples"]
    assert examples["read"] == {"kept": 120, "skipped": skipped}
    assert examples["available"] == {"positive": 60, "negative": 60}


def test_labelled_scores_from_parquet_are_judged_the_same_way(spark, tmp_path, texts):
    labelled = tmp_path / "labelled.parquet"
    rows = [{"body": t, "edu": "4"} for t in texts["good"][:5]]
    rows += [{"body": "x", "edu": "high"}, {"body": "y", "edu": "NaN"}, {"body": "z", "edu": None}]
    rows += [{"body": None, "edu": "2"}, {"body": " ", "edu": "2"}]
    pq.write_table(pa.Table.from_pylist(rows), labelled)
    config = make_config(
        tmp_path / "data",
        f"classifier_training.labelled=[{{path: {labelled}, text_field: body, score_field: edu}}]",
        "classifier_training.max_unusable_share=1",  # half of these rows are bad on purpose
    )
    examples, report = training_job.read_examples(spark, config.classifier_training, config)
    assert report["classifier_training.labelled[0]"] == {
        str(labelled): {
            "kept": 5,
            "skipped": {
                "'edu' is not a number": 1,
                "'edu' is not finite": 1,
                "no 'edu'": 1,
                "no 'body'": 1,
                "empty 'body'": 1,
            },
        }
    }
    assert examples.count() == 5


def test_a_labelled_source_whose_every_score_is_unusable_is_one_error(spark, tmp_path, capsys):
    labelled = tmp_path / "labelled.jsonl"
    labelled.write_text(
        json.dumps({"text": "one", "score": "high"})
        + "\n"
        + json.dumps({"text": "two", "score": math.nan})
        + "\n"
    )
    code, err, output = train(
        tmp_path, capsys, f"classifier_training.labelled=[{{path: {labelled}, score_field: score}}]"
    )
    refused(code, err, output, "classifier_training.labelled[0]", f"{labelled}:1: 'score' is not a number")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            [],
            "12 usable negative examples (distinct texts), fewer than classifier_training.min_examples_per_class (100)",
        ),
        (
            ["classifier_training.min_examples_per_class=10"],
            "held-out positive examples, fewer than classifier_training.min_heldout_per_class (10)",
        ),
    ],
)
def test_twelve_negatives_are_refused_before_training(
    spark, tmp_path, capsys, texts, monkeypatch, overrides, message
):
    """The sample site's 12 pages as negatives: an ROC AUC from three held-out examples is no figure."""
    positives = jsonl(tmp_path / "positives.jsonl", texts["good"])
    negatives = jsonl(tmp_path / "negatives.jsonl", texts["junk"][:12])
    monkeypatch.setattr(training_job, "train_fasttext", untrained)
    code, err, output = train(
        tmp_path,
        capsys,
        f"classifier_training.positives=[{{path: {positives}}}]",
        f"classifier_training.negatives=[{{path: {negatives}}}]",
        *overrides,
    )
    refused(code, err, output, message)


def test_kept_and_skipped_lines_add_up_to_the_input_for_random_mixes(spark, tmp_path, texts):
    """A folder of files, each a seeded random mix of good and bad lines: per file, the kept lines and the
    skipped ones by reason are exactly what went in."""
    rng = random.Random(11)
    folder = tmp_path / "positives"
    folder.mkdir()
    expected = {}
    for index in range(8):
        lines, skipped = [], {}
        for _ in range(rng.randint(1, 40)):
            if rng.random() < 0.3:
                line, reason = rng.choice(sorted(BAD_LINES.items()))
                skipped[reason] = skipped.get(reason, 0) + 1
            else:
                line = json.dumps({"text": rng.choice(texts["good"]), "n": rng.random()})
            lines.append(line)
        path = folder / f"part-{index}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        expected[str(path)] = {"kept": len(lines) - sum(skipped.values()), "skipped": skipped}
    negatives = jsonl(tmp_path / "negatives.jsonl", texts["junk"][:20])
    config = make_config(
        tmp_path / "data",
        f"classifier_training.positives=[{{path: {folder}}}]",
        f"classifier_training.negatives=[{{path: {negatives}}}]",
        "classifier_training.max_unusable_share=1",  # about 30% bad on purpose
    )
    examples, report = training_job.read_examples(spark, config.classifier_training, config)
    assert report["classifier_training.positives[0]"] == expected
    assert report["classifier_training.negatives[0]"] == {str(negatives): {"kept": 20, "skipped": {}}}
    total_kept = sum(tally["kept"] for tally in expected.values())
    assert examples.where("label = 1").count() == total_kept


@given(
    st.lists(
        st.one_of(
            st.sampled_from(sorted(BAD_LINES)),
            st.text(min_size=1).filter(str.strip).map(lambda t: json.dumps({"text": t})),
            st.text(),
        ),
        max_size=30,
    )
)
def test_every_line_is_either_usable_or_has_a_reason(lines):
    """The judge behind the counts: a line is usable (a text, no reason) or skipped (a reason, no text),
    never both or neither, whatever the line."""
    for line in lines:
        text, score, reason = judge_json_line(line, "text", None)
        assert (text is None) != (reason is None), line
        assert score is None
        if line in BAD_LINES:
            assert reason == BAD_LINES[line]
