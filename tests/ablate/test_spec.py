"""The ablation spec's checks and the stage-equality rule, without Spark or training."""

from __future__ import annotations

import pytest

from pipeline.ablate.plan import stage_identity
from pipeline.ablate.spec import PRESETS, corpus_chain, parse_spec
from pipeline.config import load_config
from pipeline.core.config import ConfigError


def spec(**changes):
    data = {"source": "s1", "variants": ["none", "rules+dedup"], "reference": "ref.jsonl", "tokens": 1000}
    return parse_spec({**data, **changes})


def test_presets_and_defaults():
    made = spec()
    assert made.base == "none" and made.seeds == (0, 1, 2)
    assert made.control and made.arms == ["none", "rules+dedup", "none.aa"]
    assert made.variants[0].overrides == tuple(PRESETS["none"])
    assert made.variants[1].slug == "rules_dedup"
    assert corpus_chain() == ["clean", "dedup", "classify", "decontaminate", "tokenize"]
    for variant in PRESETS:  # every preset is a valid config
        load_config(None, PRESETS[variant], environ={})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"variants": {"a": ["tokenize.tokenizer=x"], "b": []}}, "same for every variant"),
        ({"variants": {"a": ["bpe.vocab_size=512"], "b": []}}, "same for every variant"),
        ({"variants": {"a": ["train.lr=1"], "b": []}}, "not a corpus stage's setting"),
        ({"variants": {"a b": [], "b": []}}, "variant name"),
        ({"variants": ["none"]}, "at least two variants"),
        ({"base": "other"}, "is not one of the variants"),
        ({"seeds": [1, 1]}, "distinct seeds"),
        ({"seeds": [0]}, "one seed has none"),
        ({"seeds": []}, "2 or more distinct seeds"),
        ({"seeds": [-1, 2]}, ">= 0"),
        ({"control": "yes"}, "control is true or false"),
        ({"variants": {"none": "preset", "none.aa": []}}, "the A/A control's"),
        ({"variants": {"odd": "preset", "b": []}}, "no preset"),
        ({"tokens": 0}, "token budget"),
        ({"tasks": ["arc_easy", "arc_easy"]}, "distinct lm-eval task names"),
        ({"tasks": ["pretrain_heldout_continuation"]}, "distinct lm-eval task names"),
        ({"tasks": [3]}, "list of lm-eval task names"),
        ({"source": {"mixture": [{"corpus": "a b"}]}}, r"source.mixture.0.corpus: String should match"),
        ({"source": {"mixture": [{"corpus": "w", "weight": 0}]}}, r"source.mixture.0.weight"),
        ({"source": {"mixture": [{"corpus": "w"}, {"corpus": "w"}]}}, r"both called \['w:all'\]"),
        ({"source": {"kind": "mixture", "snapshot": "s1"}}, "a mixture source is"),
        ({"source": {"kind": "blend", "snapshot": "s1"}}, "'snapshot' or 'mixture'"),
        ({"source": {"snapshot": "s1", "corpus": "w"}}, r"unknown keys \['corpus'\]"),
    ],
)
def test_bad_specs_are_refused_naming_the_problem(changes, message):
    with pytest.raises(ConfigError, match=message):
        spec(**changes)


def test_a_stage_identity_depends_on_its_own_sections_and_input_only():
    base = load_config(None, [], environ={})
    dedup_changed = load_config(None, ["dedup.threshold=0.7"], environ={})
    clean_changed = load_config(None, ["clean.min_chars=10"], environ={})
    assert stage_identity(base, "clean", "src") == stage_identity(dedup_changed, "clean", "src")
    assert stage_identity(base, "dedup", "x") != stage_identity(dedup_changed, "dedup", "x")
    assert stage_identity(base, "clean", "src") != stage_identity(clean_changed, "clean", "src")
    assert stage_identity(base, "dedup", "x") != stage_identity(base, "dedup", "y")


def test_local_tasks_and_their_folder_relative_to_the_spec(tmp_path):
    made = parse_spec(
        {
            "source": "s1",
            "variants": ["none", "rules"],
            "reference": "ref.jsonl",
            "tokens": 10,
            "tasks": "mine",
            "task_folder": "tasks",
        },
        tmp_path,
    )
    assert made.tasks == ("mine",) and made.task_folder == tmp_path / "tasks"
    assert made.to_dict()["tasks"] == ["mine"]


def ablate(argv: list[str], capsys) -> tuple[int, str]:
    from pipeline.ablate.__main__ import main
    from pipeline.core.cli import run_cli

    code = run_cli(main, argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("reference", "message"),
    [(None, "does not exist"), ("", "holds no document"), ("[1, 2]\n", "needs a string field 'text'")],
)
def test_a_bad_reference_is_refused_before_any_stage_even_in_a_dry_run(tmp_path, capsys, reference, message):
    """The data root is empty: had anything run before the reference check, the error would name the
    missing ingest output instead."""
    path = tmp_path / "reference.jsonl"
    if reference is not None:
        path.write_text(reference)
    argv = ["--snapshot", "s1", "--variant", "none", "--variant", "rules", "--tokens", "1000"]
    argv += ["--reference", str(path), "--set", f"project.data_root={tmp_path / 'data'}"]
    for extra in ([], ["--dry-run"]):
        code, err = ablate([*argv, *extra], capsys)
        assert code == 2 and err.count("\n") == 1 and message in err and "reference" in err
        assert not (tmp_path / "data").exists()


def test_seeds_that_are_not_numbers_are_one_error_line(capsys):
    code, err = ablate(
        ["--snapshot", "s1", "--variant", "none", "--variant", "rules", "--seeds", "0,x"], capsys
    )
    assert (code, err) == (2, "error: --seeds: comma-separated whole numbers, not '0,x'\n")
