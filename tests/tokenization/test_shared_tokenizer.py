"""The tokenize stage with a shared tokenizer (Spark): snapshots of a corpus share one, and the same text gets
the same ids in each; a named or per-snapshot tokenizer by config; `pretrain tokenizer train` on several
corpora."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.tokenization import job as tokenize_job
from pipeline.tokenization import store
from pipeline.tokenization.bpe import TOKENIZER_FILE
from pipeline.tokenization.tokenizer_cli import main as tokenizer_cli
from tests.conftest import make_config
from tests.tokenization.test_tokenize_stage import read_documents

SETTINGS = ["bpe.vocab_size=400", "bpe.min_frequency=1", "tokenize.validation_fraction=0.1"]
SHARED = "The river mill ground flour for the whole valley every autumn."
WORDS = ["river", "mill", "wheel", "flour", "stone", "water", "valley", "autumn", "bread", "miller", "grain"]


def documents(seed: int, count: int = 40) -> list[tuple[str, str]]:
    """(id, text) rows: ``count`` varied documents, plus SHARED under the same id in every snapshot."""
    import random

    rng = random.Random(seed)
    rows = [
        (f"doc-{seed}-{i}", " ".join(rng.choices(WORDS, k=rng.randint(8, 40))) + ".") for i in range(count)
    ]
    return [*rows, ("shared", SHARED)]


def publish_documents(config, stage: str, snapshot: str, rows, corpus: str | None = None) -> DatasetRef:
    ref = DatasetRef(config.project.data_root, corpus or config.project.corpus, stage, snapshot)
    with StageOutput(ref, config) as out:
        (out.path / "documents").mkdir()
        table = pa.table({"id": [i for i, _ in rows], "text": [t for _, t in rows]})
        pq.write_table(table, out.path / "documents" / "part-00000.parquet")
        out.commit(rows={"documents": len(rows)})
    return ref


def tokenize(config, snapshot: str):
    output = DatasetRef.of(config, "tokenize", snapshot)
    return tokenize_job.run(config, [DatasetRef.of(config, "dedup", snapshot)], output), output


def ids_of(output: DatasetRef, text: str) -> list[int]:
    tokenizer = Tokenizer.from_file(str(output.path / TOKENIZER_FILE))
    found = [
        ids
        for split in ("train", "validation")
        for ids in read_documents(output.path, split)
        if tokenizer.decode(ids[:-1]) == text
    ]
    assert len(found) == 1
    return found[0]


@pytest.mark.slow
def test_snapshots_share_the_corpus_tokenizer_and_give_the_same_ids_for_the_same_text(tmp_path):
    config = make_config(tmp_path / "data", *SETTINGS)
    for index, snapshot in enumerate(("2026-11-01", "2026-11-02")):
        publish_documents(config, "dedup", snapshot, documents(index))
    first, first_out = tokenize(config, "2026-11-01")
    second, second_out = tokenize(config, "2026-11-02")

    # The first snapshot stored the corpus's default; the second found it and trained nothing.
    root, corpus = config.project.data_root, config.project.corpus
    assert store.stored_names(root, corpus) == ["bpe-2026-11-01"]
    default = store.default_tokenizer(root, corpus)
    for manifest in (first, second):
        assert manifest.extra["tokenizer"] == default.describe()
        assert store.manifest_digest(manifest) == default.digest
        assert manifest.extra["vocab_size"] == default.facts["vocab_size"]
    assert first.files[TOKENIZER_FILE].sha256 == second.files[TOKENIZER_FILE].sha256
    assert ids_of(first_out, SHARED) == ids_of(second_out, SHARED)

    # A BPE of the snapshot's own, by config: another tokenizer, not stored.
    own = make_config(tmp_path / "data", *SETTINGS, "tokenize.tokenizer=snapshot", "project.seed=7")
    publish_documents(own, "dedup", "2026-11-03", [(i, t.upper()) for i, t in documents(2)])
    third, _ = tokenize(own, "2026-11-03")
    assert third.extra["tokenizer"]["kind"] == "snapshot" and third.extra["tokenizer"]["name"] is None
    assert store.manifest_digest(third) != default.digest
    assert store.stored_names(root, corpus) == ["bpe-2026-11-01"]

    # A tokenizer trained on two corpora, then used by name for a snapshot: its digest in the manifest.
    other = make_config(tmp_path / "data", *SETTINGS, "project.corpus=books")
    publish_documents(other, "dedup", "v1", documents(5, count=30), corpus="books")
    common = [
        "--set",
        f"project.data_root={tmp_path / 'data'}",
        "--set",
        "logging.console=false",
        *[arg for setting in SETTINGS for arg in ("--set", setting)],
    ]
    assert (
        tokenizer_cli(
            [
                "train",
                "--name",
                "both",
                "--source",
                "sample:2026-11-*",
                "--source",
                "books:all",
                "--input-stage",
                "dedup",
                *common,
            ]
        )
        == 0
    )
    both = store.load_stored(root, corpus, "both")
    assert both.facts["sources"] == [
        "books/dedup/v1",
        "sample/dedup/2026-11-01",
        "sample/dedup/2026-11-02",
        "sample/dedup/2026-11-03",
    ]
    assert [entry["stage"] for entry in both.manifest.inputs] == ["dedup"] * 4
    named = make_config(tmp_path / "data", *SETTINGS, "tokenize.tokenizer=both")
    folder = tmp_path / "out"
    folder.mkdir()
    # A stored tokenizer by name needs no documents: nothing is trained.
    chosen = tokenize_job.choose_tokenizer(None, named, None, DatasetRef.of(named, "tokenize", "x"), folder)
    assert chosen.described == both.describe() and store.folder_digest(folder) == both.digest
    assert store.default_name(root, corpus) == "bpe-2026-11-01"  # still the first
