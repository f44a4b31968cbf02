"""An ablation whose source is a weighted mixture of corpora and snapshots, planned without Spark or training:
every selected snapshot goes through each variant's corpus stages in its own corpus, and each variant's
trainings read the same mixture (names, weights) of that variant's own token outputs."""

from __future__ import annotations

import json

import pytest

from pipeline.ablate.plan import make_plan, source_parts, training_overrides, variant_config
from pipeline.ablate.spec import corpus_chain, parse_spec
from pipeline.config import load_config
from pipeline.core.config import ConfigError
from pipeline.core.snapshots import base_snapshot, is_variant
from pipeline.data.mixture import MixtureError
from tests.classify.corpus import document, publish_documents
from tests.conftest import make_config

VARIANTS = ["none", "rules", "rules+dedup"]


def mixture_spec(mixture, reference, name="mix"):
    return parse_spec(
        {
            "name": name,
            "source": {"stage": "ingest", "mixture": mixture},
            "variants": VARIANTS,
            "reference": str(reference),
            "tokens": 5000,
        }
    )


@pytest.fixture
def reference(tmp_path):
    """Planning reads the reference before anything else, so it must be a real one."""
    path = tmp_path / "ref.jsonl"
    path.write_text(json.dumps({"text": "A held-out paragraph of prose to score every variant on."}) + "\n")
    return path


@pytest.fixture
def corpora(tmp_path):
    """web: three ingested snapshots and an ablation variant of the first (which a pattern never picks);
    books: one."""
    for corpus, snapshots in {"web": ["s1", "s2", "s3", "s1.ab-0123456789abcdef"], "books": ["b1"]}.items():
        config = make_config(tmp_path, f"project.corpus={corpus}")
        for index, snapshot in enumerate(snapshots):
            texts = [f"{corpus} {snapshot} document {n} " * (index + 3) for n in range(3)]
            publish_documents(config, "ingest", snapshot, [document(text) for text in texts], files=1)
    return [f"project.data_root={tmp_path}", "project.corpus=web", "logging.console=false"]


def test_every_selected_snapshot_is_staged_per_variant_in_its_corpus_and_trained_as_one_mixture(
    corpora, reference
):
    spec = mixture_spec(
        [
            {"corpus": "web", "snapshots": "last:2", "weight": 3},
            {"corpus": "books", "weight": 1, "name": "lit"},
        ],
        reference,
    )
    plan = make_plan(spec, None, corpora)

    assert [(p.source, p.ref.corpus, p.ref.snapshot) for p in plan.parts] == [
        ("web", "web", "s2"),
        ("web", "web", "s3"),
        ("lit", "books", "b1"),
    ]
    chain = corpus_chain()
    assert len(plan.steps) == len(VARIANTS) * len(plan.parts) * len(chain)
    for step in plan.steps:
        part = plan.parts[step.part]
        assert step.output.corpus == part.ref.corpus and is_variant(step.output.snapshot)
        assert base_snapshot(step.output.snapshot) == part.ref.snapshot
    # Per part, clean is shared by the two variants that differ only in dedup.
    for index in range(len(plan.parts)):
        clean = {s.variant: s for s in plan.steps if s.stage == "clean" and s.part == index}
        assert (
            clean["rules"].output == clean["rules+dedup"].output and clean["rules+dedup"].action == "shared"
        )
        assert clean["none"].output != clean["rules"].output

    # One tokenizer, stored in the project's corpus, named so that the books part's tokenize finds it.
    assert plan.tokenizer == "web/ablate-mix"
    books = variant_config(spec, spec.variants[0], None, corpora, plan.tokenizer, "books")
    assert books.project.corpus == "books" and books.tokenize.tokenizer == "web/ablate-mix"

    for training in plan.trainings:
        config = load_config(None, [*corpora, *training_overrides(plan, training)], environ={})
        declared = [source.model_dump(mode="json", exclude_none=True) for source in config.data.mixture]
        tokens = {(ref.corpus, ref.snapshot) for ref in plan.arm_tokens(training.variant)}
        assert [(d.get("name"), d["corpus"], d["weight"]) for d in declared] == [
            ("web", "web", 3.0),
            ("lit", "books", 1.0),
        ]
        named = {(d["corpus"], snapshot) for d in declared for snapshot in d["snapshots"]}
        assert named == tokens and len(tokens) == 3  # its own variant's outputs, every part once
        assert is_variant(training.snapshot) and base_snapshot(training.snapshot) == "mix"
    by_variant = {t.variant: t.snapshot for t in plan.trainings}
    assert len(set(by_variant.values())) == len(VARIANTS)  # a run folder per variant

    described = plan.describe()
    assert "mixture web:last:2 (0.75), lit=books:all (0.25)" in described
    assert "books/clean/b1.ab-" in described
    assert json.loads(json.dumps(plan.to_dict()))["trainings"][0]["tokens"][2].startswith("books/b1.ab-")


def test_a_mixture_source_that_selects_nothing_is_refused_naming_it(corpora, reference):
    spec = mixture_spec([{"corpus": "web", "snapshots": "2027-*"}, {"corpus": "books"}], reference)
    with pytest.raises(MixtureError, match=r"source.mixture\[0\] \(web\).*match no complete ingest output"):
        make_plan(spec, None, corpora)
    missing = mixture_spec([{"corpus": "web"}, {"corpus": "papers"}], reference)
    with pytest.raises(MixtureError, match=r"unknown corpus 'papers'"):
        source_parts(missing, load_config(None, corpora, environ={}))


def test_the_command_plans_a_mixture_ablation(corpora, reference, capsys):
    from pipeline.ablate.__main__ import main

    arguments = ["--name", "cli", "--reference", str(reference), "--tokens", "2000"]
    arguments += ["--variant", "none", "--variant", "rules", "--dry-run"]
    arguments += [f"--set={override}" for override in corpora]
    mixture = "[{corpus: web, snapshots: [s1, s3], weight: 2}, {corpus: books}]"
    assert main(["--mixture", mixture, *arguments]) == 0
    printed = capsys.readouterr().out
    assert "from ingest mixture web:s1,s3 (0.67), books:all (0.33)" in printed
    assert "web/clean/s1.ab-" in printed and "books/tokenize/b1.ab-" in printed
    with pytest.raises(ConfigError, match="--snapshot or --mixture"):
        main(["--mixture", mixture, "--snapshot", "s1", *arguments])
    with pytest.raises(ConfigError, match="--mixture: not YAML"):
        main(["--mixture", "[{corpus: web", *arguments])
