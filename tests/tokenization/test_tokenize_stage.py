import pyarrow.parquet as pq
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from pipeline.core.storage import DatasetRef
from pipeline.tokenization.shards import Shard, shard_prefixes


def test_shards_hold_every_document_once_with_eos(sample_corpus):
    config, snapshot = sample_corpus
    tokens = DatasetRef.of(config, "tokenize", snapshot)
    manifest = tokens.manifest()
    tokenizer = Tokenizer.from_file(str(tokens.path / "tokenizer.json"))
    eos = tokenizer.token_to_id(config.tokenizer.eos_token)
    documents = (
        pq.read_table(DatasetRef.of(config, "clean", snapshot).path / "documents").column("text").to_pylist()
    )

    decoded = []
    for split in ("train", "validation"):
        for prefix in shard_prefixes(tokens.path / split):
            shard = Shard(prefix)
            for i in range(len(shard)):
                ids = shard.document(i).tolist()
                assert ids[-1] == eos and eos not in ids[:-1]
                decoded.append(tokenizer.decode(ids[:-1]))
    assert sorted(decoded) == sorted(documents)
    assert manifest.rows["train_documents"] + manifest.rows["validation_documents"] == len(documents)
    assert manifest.rows["validation_documents"] >= 1
    total = sum(manifest.counters["tokens"].values())
    assert total == sum(s["tokens"] for s in manifest.extra["shards"])


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
