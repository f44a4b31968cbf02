"""data.mixture: validated at config load, resolved against the data root with one clear error per problem,
and read by the one loader in the right order (a single snapshot's epochs, or the blend of a mixture)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.core.config import ConfigError
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.data.loader import build_loader
from pipeline.data.mixture import MixtureError, freeze_mixture, resolve_mixture, training_mixture
from pipeline.tokenization.bpe import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE
from pipeline.data.tokenizer_files import folder_digest
from tests.conftest import make_config
from tests.data.test_blend import write_source

FACTS = {
    "vocab_size": 3000,
    "dtype": "uint16",
    "eos_token": "<e>",
    "eos_id": 0,
    "pad_token": "<p>",
    "pad_id": 1,
}


def publish_tokens(root, corpus, snapshot, index=0, tokenizer="A", documents=40, complete=True):
    """A tokenize output of random documents in source ``index``'s id range, with tokenizer files whose
    content is ``tokenizer`` (so equal names give equal digests)."""
    config = make_config(root, f"project.corpus={corpus}")
    ref = DatasetRef.of(config, "tokenize", snapshot)
    if not complete:
        (ref.path / "train").mkdir(parents=True)
        return ref
    with StageOutput(ref, config) as out:
        write_source(out.path / "train", index, [documents], lambda r: int(r.integers(2, 30)), seed=index)
        (out.path / TOKENIZER_FILE).write_text(json.dumps({"tokenizer": tokenizer}))
        (out.path / TOKENIZER_CONFIG_FILE).write_text("{}")
        tokens = sum(int(np.fromfile(p, dtype=np.uint16).size) for p in (out.path / "train").glob("*.bin"))
        out.commit(counters={"tokens": {"train": tokens, "validation": 0}}, extra=dict(FACTS))
    return ref


def mixture_config(root, mixture, *more):
    return make_config(
        root, f"data.mixture={json.dumps(mixture)}", "train.seq_len=8", "train.batch_size=2", *more
    )


@pytest.fixture
def data_root(tmp_path):
    root = tmp_path / "data"
    for day, snapshot in enumerate(["2026-11-01", "2026-11-02", "2026-11-03"]):
        publish_tokens(root, "web", snapshot, index=day)
    publish_tokens(root, "books", "v1", index=3)
    return root


def test_snapshots_are_chosen_by_name_glob_range_last_or_all(data_root):
    mixture = resolve_mixture(
        mixture_config(
            data_root,
            [
                {"corpus": "web", "snapshots": "2026-11-02..", "weight": 3},
                {"corpus": "books", "snapshots": "all", "weight": 1},
            ],
        )
    )
    assert mixture.names == ["web", "books"] and mixture.weights == [0.75, 0.25]
    assert mixture.sources[0].snapshots == ["2026-11-02", "2026-11-03"]
    assert not mixture.is_default
    lineage = mixture.lineage()
    assert [(entry["source"], entry["snapshot"]) for entry in lineage] == [
        ("web", "2026-11-02"),
        ("web", "2026-11-03"),
        ("books", "v1"),
    ]
    assert {entry["tokenizer_digest"] for entry in lineage} == {mixture.tokenizer_digest}
    assert mixture.tokenizer == FACTS
    for spec, chosen in [
        ("last:1", ["2026-11-03"]),
        ("2026-11-0[13]", ["2026-11-01", "2026-11-03"]),
        (["2026-11-02"], ["2026-11-02"]),
    ]:
        config = mixture_config(data_root, [{"corpus": "web", "snapshots": spec}])
        assert resolve_mixture(config).sources[0].snapshots == chosen


def test_a_corpus_twice_gets_names_that_tell_the_sources_apart(data_root):
    config = mixture_config(
        data_root,
        [
            {"corpus": "web", "snapshots": "last:1"},
            {"corpus": "web", "snapshots": "..2026-11-02", "weight": 2},
        ],
    )
    assert resolve_mixture(config).names == ["web:last:1", "web:..2026-11-02"]


@pytest.mark.parametrize(
    ("mixture", "message"),
    [
        (
            [{"corpus": "webb"}],
            r"data\.mixture\[0\] \(webb\): unknown corpus 'webb'; corpora under .*\['books', 'web'\]",
        ),
        (
            [{"corpus": "web"}, {"corpus": "books", "snapshots": ["v2"]}],
            r"data\.mixture\[1\] \(books\): corpus books has no tokenize output for snapshot\(s\) \['v2'\]",
        ),
        (
            [{"corpus": "web", "snapshots": "2025-*"}],
            r"'2025-\*' match no complete tokenize output of corpus web",
        ),
    ],
)
def test_unknown_corpora_and_snapshots_are_clear_errors_naming_the_source(data_root, mixture, message):
    with pytest.raises(MixtureError, match=message):
        resolve_mixture(mixture_config(data_root, mixture))


def test_an_incomplete_output_is_named_or_left_out(data_root):
    publish_tokens(data_root, "web", "2026-11-04", complete=False)
    with pytest.raises(MixtureError, match=r"snapshot\(s\) \['2026-11-04'\] is incomplete"):
        resolve_mixture(mixture_config(data_root, [{"corpus": "web", "snapshots": ["2026-11-04"]}]))
    chosen = resolve_mixture(mixture_config(data_root, [{"corpus": "web", "snapshots": "all"}]))
    assert chosen.sources[0].snapshots == ["2026-11-01", "2026-11-02", "2026-11-03"]  # every complete one


def test_two_tokenizers_are_refused_naming_both_digests(data_root):
    other = publish_tokens(data_root, "books", "v2", index=4, tokenizer="B")
    books_v1 = DatasetRef(str(data_root), "books", "tokenize", "v1")
    config = mixture_config(data_root, [{"corpus": "books", "snapshots": "all"}])
    with pytest.raises(MixtureError) as error:
        resolve_mixture(config)
    message = str(error.value)
    assert folder_digest(books_v1.path) in message and folder_digest(other.path) in message
    assert "books/v1" in message and "books/v2" in message
    # The same tokenizer files in another corpus: one digest, mixed happily.
    ok = mixture_config(data_root, [{"corpus": "web"}, {"corpus": "books", "snapshots": ["v1"]}])
    assert resolve_mixture(ok).tokenizer_digest == folder_digest(books_v1.path)


def test_a_run_reads_the_resolution_frozen_with_its_config_and_refuses_a_snapshot_changed_since(
    data_root, tmp_path
):
    from pipeline.config import freeze_config, read_frozen_config
    from pipeline.train.launcher.runs import resume_identity

    spec = [{"corpus": "web", "snapshots": "all", "weight": 3}, {"corpus": "books", "weight": 1}]
    config = mixture_config(data_root, spec)
    resolved = resolve_mixture(config)
    frozen = read_frozen_config(freeze_config(freeze_mixture(config, "run"), tmp_path / "frozen.yaml"))
    # What the run reads, not a setting: the hash, the MLflow params and the resume identity are the declared
    # mixture's, so a resumed or relaunched run finds the same ones.
    assert frozen.data.resolved_mixture is not None and config.data.resolved_mixture is None
    assert frozen.hash == config.hash and frozen.flat() == config.flat()
    assert resume_identity(frozen) == resume_identity(config)
    # A snapshot published after the freeze is not in this run; the one resolved then is, read as it was.
    publish_tokens(data_root, "web", "2026-11-04", index=4)
    assert resolve_mixture(config).sources[0].snapshots[-1] == "2026-11-04"
    read = training_mixture(frozen, "run")
    assert read.lineage() == resolved.lineage() and read.tokenizer_digest == resolved.tokenizer_digest
    assert not read.is_default and read.weights == resolved.weights
    # A frozen snapshot re-tokenized since is refused, naming it and both digests.
    was = DatasetRef(str(data_root), "books", "tokenize", "v1").manifest().digest
    publish_tokens(data_root, "books", "v1", index=3, documents=41)
    now = DatasetRef(str(data_root), "books", "tokenize", "v1").manifest().digest
    with pytest.raises(
        MixtureError, match=rf"\(books\): tokenize output books/v1 changed since .*{now}, frozen {was}"
    ):
        training_mixture(frozen, "run")
    # A resolution of another data.mixture (an edited file) is refused rather than trained.
    edited = frozen.with_values({"data.mixture": [{"corpus": "web", "snapshots": "last:1"}]}, source="a test")
    with pytest.raises(MixtureError, match="resolved from"):
        training_mixture(edited, "run")
    reweighted = frozen.with_values({"data.mixture": [{**spec[0], "weight": 1}, spec[1]]}, source="a test")
    with pytest.raises(MixtureError, match="resolved from"):
        training_mixture(reweighted, "run")
    # Without a mixture there is nothing to freeze: the one snapshot is resolved where it is trained.
    single = make_config(data_root, "project.corpus=web")
    assert freeze_mixture(single, "2026-11-02") is single


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('[{"corpus": "web", "weight": 0}]', r"data\.mixture\.0\.weight"),
        ('[{"corpus": "web", "snapshots": "last:0"}]', r"data\.mixture\.0\.snapshots.*last:N"),
        ('[{"corpus": "bad name"}]', r"data\.mixture\.0\.corpus"),
        ('[{"corpus": "web", "wieght": 2}]', r"data\.mixture\.0\.wieght"),
        ("[]", r"data\.mixture"),
        ('[{"corpus": "web"}, {"corpus": "books", "name": "web"}]', r"both called \['web'\]"),
    ],
)
def test_a_malformed_mixture_fails_at_config_load_naming_the_key(tmp_path, value, message):
    with pytest.raises(ConfigError, match=message):
        make_config(tmp_path, f"data.mixture={value}")


def test_without_a_mixture_the_one_snapshot_is_read_in_its_own_order(data_root):
    config = make_config(data_root, "project.corpus=web", "train.seq_len=8", "train.batch_size=2")
    mixture = resolve_mixture(config, snapshot="2026-11-02")
    assert mixture.is_default and mixture.names == ["web"] and mixture.sources[0].snapshots == ["2026-11-02"]
    loader = build_loader(mixture, config, rank=1, world_size=2)
    assert loader.kind == "packed"
    assert next(loader).sources is None and not loader.reports_sources  # the run's figures are its own
    with pytest.raises(MixtureError, match="snapshot 2026-12-01: corpus web has no tokenize output"):
        resolve_mixture(config, snapshot="2026-12-01")


def test_a_mixture_is_read_in_the_blended_order_with_the_configured_batching(data_root):
    spec = [{"corpus": "web", "snapshots": "all", "weight": 2}, {"corpus": "books", "weight": 1}]
    config = mixture_config(data_root, spec)
    loader = build_loader(resolve_mixture(config), config, rank=0, world_size=2)
    assert loader.kind == "blended_packed" and loader.source_names == ["web", "books"]
    assert loader.reports_sources  # figures per source, as for a declared mixture of one source
    one = mixture_config(data_root, [{"corpus": "books"}])
    assert build_loader(resolve_mixture(one), one).reports_sources
    batch = next(loader)
    assert batch.inputs.shape == (2, 8) and batch.sources.tolist() == [0, 1]  # Megatron's rule: web, books
    budget = mixture_config(data_root, spec, "data.batching=token_budget", "data.max_tokens_per_batch=64")
    loader = build_loader(resolve_mixture(budget), budget)
    assert loader.kind == "blended_token_budget"
    assert next(loader).inputs.numel() <= 64


@pytest.mark.parametrize("batching", ["packed", "token_budget"])
def test_the_data_order_has_its_own_seed_defaulting_to_the_projects(data_root, batching):
    """data.order_seed changes which windows a step reads and nothing else; unset, project.seed orders the
    data as before (the ablation's A/A control keeps the weights' seed and changes only this one)."""
    settings = ["project.corpus=web", "train.seq_len=8", "train.batch_size=2", f"data.batching={batching}"]

    def loader(*extra: str):
        config = make_config(data_root, *settings, "project.seed=3", *extra)
        return build_loader(resolve_mixture(config, snapshot="2026-11-02"), config)

    def first_batches(*extra: str) -> list:
        batches = loader(*extra)
        return [next(batches).inputs.tolist() for _ in range(4)]

    assert first_batches() == first_batches("data.order_seed=3")
    assert first_batches() != first_batches("data.order_seed=4")
    assert loader("data.order_seed=4").state_dict()["seed"] == 4
