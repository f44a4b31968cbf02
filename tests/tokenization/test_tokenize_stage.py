import hashlib
import unicodedata

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.data.shards import Shard, shard_prefixes
from pipeline.tokenization import job as tokenize_job
from tests.conftest import make_config


def read_documents(path, split):
    """Every document of a split, in stream order, as id lists."""
    documents = []
    for prefix in shard_prefixes(path / split):
        shard = Shard(prefix)
        documents += [shard.document(i).tolist() for i in range(len(shard))]
    return documents


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_shards_hold_every_document_once_with_eos(sample_corpus):
    config, snapshot = sample_corpus
    tokens = DatasetRef.of(config, "tokenize", snapshot)
    manifest = tokens.manifest()
    tokenizer = Tokenizer.from_file(str(tokens.path / "tokenizer.json"))
    eos = tokenizer.token_to_id(config.bpe.eos_token)
    assert manifest.extra["eos_id"] == eos and manifest.extra["dtype"] == "uint16"
    documents = (
        pq.read_table(DatasetRef.of(config, "clean", snapshot).path / "documents").column("text").to_pylist()
    )

    decoded = []
    for split in ("train", "validation"):
        for ids in read_documents(tokens.path, split):
            assert ids[-1] == eos and eos not in ids[:-1]
            decoded.append(tokenizer.decode(ids[:-1]))
    assert sorted(decoded) == sorted(unicodedata.normalize("NFC", d) for d in documents)
    assert manifest.rows["train_documents"] + manifest.rows["validation_documents"] == len(documents)
    assert manifest.rows["validation_documents"] >= 1
    total = sum(manifest.counters["tokens"].values())
    assert total == sum(s["tokens"] for s in manifest.extra["shards"])


@pytest.mark.slow
def test_each_validation_shard_names_its_documents_in_order(sample_corpus):
    """``<shard>.docs.parquet`` row i is document i of its shard: decoding that document gives the text of the
    clean document with the row's id, and the row's host and language are that document's."""
    config, snapshot = sample_corpus
    tokens = DatasetRef.of(config, "tokenize", snapshot)
    tokenizer = Tokenizer.from_file(str(tokens.path / "tokenizer.json"))
    clean = pq.read_table(DatasetRef.of(config, "clean", snapshot).path / "documents").to_pylist()
    by_id = {row["id"]: row for row in clean}
    prefixes = shard_prefixes(tokens.path / "validation")
    assert prefixes and not list((tokens.path / "train").glob("*" + tokenize_job.DOCUMENTS_SUFFIX))
    for prefix in prefixes:
        shard = Shard(prefix)
        described = pq.read_table(prefix.with_name(prefix.name + tokenize_job.DOCUMENTS_SUFFIX)).to_pylist()
        assert len(described) == len(shard)
        for index, row in enumerate(described):
            source = by_id[row["id"]]
            assert tokenizer.decode(shard.document(index).tolist()[:-1]) == unicodedata.normalize(
                "NFC", source["text"]
            )
            assert (row["domain"], row["lang"]) == (source["domain"], source["lang"])


@pytest.mark.slow
def test_manifest_lists_each_shard_with_counts_and_checksums(sample_corpus):
    config, snapshot = sample_corpus
    ref = DatasetRef.of(config, "tokenize", snapshot)
    manifest = ref.manifest()
    listed = {entry["shard"]: entry for entry in manifest.extra["shards"]}
    on_disk = {
        f"{p.parent.name}/{p.name}"
        for split in ("train", "validation")
        for p in shard_prefixes(ref.path / split)
    }
    assert set(listed) == on_disk
    for name, entry in listed.items():
        shard = Shard(ref.path / name)
        assert (entry["documents"], entry["tokens"]) == (len(shard), shard.num_tokens)
        assert entry["bin_sha256"] == sha256(ref.path / f"{name}.bin") == manifest.files[f"{name}.bin"].sha256
        assert entry["idx_sha256"] == sha256(ref.path / f"{name}.idx") == manifest.files[f"{name}.idx"].sha256
    assert manifest.counters["dropped"] == {"empty": 0}
    assert pq.read_table(ref.path / "excluded").num_rows == 0


@pytest.mark.slow
def test_tokenizer_loads_in_transformers_and_round_trips(sample_corpus):
    config, snapshot = sample_corpus
    path = DatasetRef.of(config, "tokenize", snapshot).path / "tokenizer.json"
    fast = PreTrainedTokenizerFast(tokenizer_file=str(path))
    for text in [
        "The river turned the wheel.",
        "茶起源于中国。",
        "def f(x):\n    return x ** 2\n",
        "emoji 🚲🐝 ok",
    ]:
        assert fast.decode(fast.encode(text)) == text


def bad_corpus():
    """Ids and raw UTF-8 texts: ordinary documents plus every kind of bad input the stage must survive."""
    rng = np.random.default_rng(5)
    words = ["river", "mill", "wheel", "flour", "茶", "中国", "🐝", "def", "return", "(x)", "\n"]
    rows = [
        (f"doc-{i:03d}", " ".join(rng.choice(words, size=int(rng.integers(5, 80)))).encode())
        for i in range(60)
    ]
    rows += [
        ("empty-1", b""),
        ("empty-2", " \n\t\u3000 ".encode()),
        ("empty-3", None),
        ("surrogate", b"half a pair \xed\xa0\x80 here"),
        ("bad-byte", b"latin-1 caf\xe9 leaked in"),
        ("long", " ".join(rng.choice(words, size=4000)).encode()),
        ("special", b"a page quoting <|endoftext|> in its text"),
        ("nfkc", "ｆｕｌｌｗｉｄｔｈ ﬁ ①".encode()),
    ]
    return rows


def write_clean_input(config, snapshot, rows, files):
    """A clean-stage output holding rows, written as `files` Parquet files without validating UTF-8."""
    ref = DatasetRef.of(config, "clean", snapshot)
    with StageOutput(ref, config) as out:
        (out.path / "documents").mkdir()
        for part in range(files):
            chosen = rows[part::files]
            texts = pa.array([text for _, text in chosen], pa.binary()).view(pa.string())
            table = pa.table({"id": [doc_id for doc_id, _ in chosen], "text": texts})
            pq.write_table(table, out.path / "documents" / f"part-{part:05d}.parquet")
        out.commit(rows={"documents": len(rows)})
    return ref


def expected_text(raw):
    return unicodedata.normalize("NFC", raw.decode("utf-8", "replace"))


@pytest.mark.slow
def test_bad_input_is_counted_shards_are_capped_and_output_is_deterministic(tmp_path):
    rows = bad_corpus()
    settings = [
        "bpe.vocab_size=400",
        "bpe.min_frequency=1",
        "bpe.split_cjk=true",
        "tokenize.chunk_chars=1000",
        "tokenize.max_tokens_per_shard=700",
        "tokenize.num_shards=3",
        "tokenize.validation_fraction=0.2",
    ]
    config = make_config(tmp_path / "data", *settings)
    clean = write_clean_input(config, "bad", rows, files=1)
    output = DatasetRef.of(config, "tokenize", "bad")
    manifest = tokenize_job.run(config, [clean], output)

    tokenizer = Tokenizer.from_file(str(output.path / "tokenizer.json"))
    eos = manifest.extra["eos_id"]
    decoded = []
    for split in ("train", "validation"):
        documents = read_documents(output.path, split)
        assert len(documents) == manifest.rows[f"{split}_documents"] >= 1
        for ids in documents:
            assert ids[-1] == eos and eos not in ids[:-1]
            decoded.append(tokenizer.decode(ids[:-1]))
    kept = [raw for doc_id, raw in rows if not doc_id.startswith("empty")]
    assert sorted(decoded) == sorted(expected_text(raw) for raw in kept)

    assert manifest.rows["excluded"] == 3 and manifest.counters["dropped"] == {"empty": 3}
    excluded = pq.read_table(output.path / "excluded").to_pylist()
    assert sorted((row["id"], row["reason"]) for row in excluded) == [
        (f"empty-{i}", "empty") for i in (1, 2, 3)
    ]
    assert manifest.counters["repaired_unicode"] == 2
    assert manifest.counters["chunked_documents"] == 1
    for entry in manifest.extra["shards"]:
        assert entry["tokens"] <= 700 or (entry["documents"] == 1 and entry["oversized_documents"] == 1)
    assert manifest.counters["shards"]["train"] > 3, "the cap made tasks roll over to more files"
    assert not list(output.path.rglob("*.tmp*"))

    # Same rows in another number of input files, re-run into the same snapshot: the same bytes.
    clean_again = write_clean_input(config, "bad", rows[::-1], files=4)
    again = tokenize_job.run(config, [clean_again], output)
    shard_files = {name: entry.sha256 for name, entry in manifest.files.items() if "shard-" in name}
    assert shard_files == {name: entry.sha256 for name, entry in again.files.items() if "shard-" in name}
    assert again.files["tokenizer.json"].sha256 == manifest.files["tokenizer.json"].sha256
    assert not list(output.path.parent.glob(".staging-*"))


def test_validation_threshold_takes_at_least_one_document_but_never_the_only_one():
    threshold = tokenize_job.validation_threshold
    assert threshold(0.05, documents=10, under_threshold=3, smallest_bucket=7) == 50_000
    assert threshold(0.05, documents=10, under_threshold=0, smallest_bucket=123_456) == 123_457
    assert threshold(0.0, documents=10, under_threshold=0, smallest_bucket=5) == 0
    assert threshold(0.5, documents=1, under_threshold=1, smallest_bucket=5) == 0
