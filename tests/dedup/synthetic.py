"""A corpus with planted duplicates, and exact Jaccard written plainly, for tests and the benchmark.

Only tests/dedup and ``benchmarks/dedup.py`` / ``benchmarks/mixture.py`` use it, so it lives with the tests,
not in the installed package.

Documents are Zipf-distributed words from a random vocabulary, so unrelated documents share almost no
5-gram. A planted near-duplicate replaces one contiguous block of its source's words with fresh words;
the block length is chosen so the shingle-set Jaccard lands near a target level, and the true value is
then measured with ``plain_jaccard`` (Python sets of word tuples; it shares no code with the vectorised
path, which is what makes it a reference).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pyarrow as pa

WORD = re.compile(r"\w+")
CLEAN_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("url", pa.string()),
        ("domain", pa.string()),
        ("fetch_time", pa.timestamp("us", tz="UTC")),
        ("text", pa.string()),
        ("n_chars", pa.int64()),
        ("content_hash", pa.string()),
        ("lang", pa.string()),
    ]
)


def plain_shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    """Word n-grams of lower-cased ``\\w+`` words; fewer than n words give one shingle of all of them."""
    words = WORD.findall(text.lower())
    if not words:
        return set()
    if len(words) < n:
        return {tuple(words)}
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def plain_jaccard(a: str, b: str, n: int = 5) -> float:
    sa, sb = plain_shingles(a, n), plain_shingles(b, n)
    union = sa | sb
    return len(sa & sb) / len(union) if union else 1.0


def stable_id(url: str) -> str:
    return hashlib.sha1(url.encode()).hexdigest()[:16]


def vocabulary(rng: random.Random, size: int) -> list[str]:
    consonants, vowels = "bcdfghjklmnprstvwz", "aeiou"
    words: set[str] = set()
    while len(words) < size:
        syllables = rng.randint(1, 4)
        words.add("".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(syllables)))
    return sorted(words)


class WordSource:
    """Zipf-like word draws (weight 1/rank) from a fixed vocabulary."""

    def __init__(self, rng: random.Random, size: int = 20_000) -> None:
        self.rng = rng
        self.words = vocabulary(rng, size)
        weights = [1.0 / (rank + 1) ** 0.9 for rank in range(size)]
        total = sum(weights)
        self.cumulative = []
        running = 0.0
        for weight in weights:
            running += weight / total
            self.cumulative.append(running)

    def draw(self, count: int) -> list[str]:
        return self.rng.choices(self.words, cum_weights=self.cumulative, k=count)


def as_text(words: list[str], rng: random.Random) -> str:
    """Words as sentences with capitals, punctuation and line breaks, all of which dedup ignores."""
    out, i = [], 0
    while i < len(words):
        length = rng.randint(6, 18)
        sentence = words[i : i + length]
        out.append(sentence[0].capitalize() + " " + " ".join(sentence[1:]) + rng.choice(".!?;"))
        i += length
    lines, line = [], []
    for sentence in out:
        line.append(sentence)
        if rng.random() < 0.25:
            lines.append(" ".join(line))
            line = []
    if line:
        lines.append(" ".join(line))
    return "\n".join(lines)


def block_for_jaccard(words: int, target: float, n: int = 5) -> int:
    """Words to replace (one block) so that shingle Jaccard is about ``target``."""
    total = words - n + 1
    shared = round(2 * target * total / (1 + target))
    return max(0, min(words, total - shared - n + 1)) if target < 1 else 0


def near_copy(words: list[str], target: float, source: WordSource, n: int = 5) -> list[str]:
    block = block_for_jaccard(len(words), target, n)
    if block == 0:
        return list(words)
    start = source.rng.randint(0, len(words) - block)
    return words[:start] + source.draw(block) + words[start + block :]


@dataclass
class PlantedCorpus:
    rows: list[dict]
    # (copy id, source id, target level) for every planted copy
    planted: list[tuple[str, str, float]] = field(default_factory=list)

    def table(self) -> pa.Table:
        return pa.Table.from_pylist(self.rows, schema=CLEAN_SCHEMA)


def document(url: str, text: str, fetched: datetime, lang: str = "en") -> dict:
    return {
        "id": stable_id(url),
        "url": url,
        "domain": url.split("/")[2],
        "fetch_time": fetched,
        "text": text,
        "n_chars": len(text),
        "content_hash": hashlib.sha256(text.encode()).hexdigest(),
        "lang": lang,
    }


def planted_corpus(
    n_docs: int,
    seed: int,
    levels: tuple[float, ...] = (0.5, 0.7, 0.8, 0.9, 1.0),
    copy_fraction: float = 0.3,
    words: tuple[int, int] = (80, 400),
    n: int = 5,
) -> PlantedCorpus:
    """``n_docs`` documents; about ``copy_fraction`` of them are planted copies of another document.

    A copy's source is an original or, one time in four, an earlier copy (chains test transitivity).
    Level 1.0 copies differ from their source only in case, punctuation and line breaks.
    """
    rng = random.Random(seed)
    source = WordSource(rng)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    corpus = PlantedCorpus(rows=[])
    bodies: list[list[str]] = []
    ids: list[str] = []
    copies = round(n_docs * copy_fraction)
    originals = max(1, n_docs - copies)
    for index in range(n_docs):
        url = f"https://site{index % 97}.example/page/{index}"
        if index < originals:
            body = source.draw(rng.randint(*words))
        else:
            parent = rng.randrange(len(bodies)) if rng.random() < 0.25 else rng.randrange(originals)
            level = rng.choice(levels)
            body = near_copy(bodies[parent], level, source, n)
            corpus.planted.append((stable_id(url), ids[parent], level))
        bodies.append(body)
        ids.append(stable_id(url))
        fetched = start + timedelta(seconds=rng.randrange(86_400 * 30))
        corpus.rows.append(document(url, as_text(body, rng), fetched))
    order = list(range(n_docs))
    rng.shuffle(order)
    corpus.rows = [corpus.rows[i] for i in order]
    return corpus


def stored_keys_of(config, snapshot: str, rows: list[dict]) -> pa.Table:
    """The keys (``keys/``) the dedup stage stores for a snapshot whose documents are all distinct, so all
    kept, computed with the stage's own feature code in this process; sorted by id."""
    from pipeline.dedup.job import feature_batches, minhasher

    hasher = minhasher(config.dedup, config.project.seed)
    table = pa.Table.from_pylist([{"id": row["id"], "text": row["text"]} for row in rows])
    batches = feature_batches(iter(table.to_batches(1000)), hasher, False, config.dedup.near)
    features = pa.Table.from_batches(list(batches))
    return pa.table(
        {
            "snapshot": pa.array([snapshot] * features.num_rows, pa.string()),
            "id": features.column("id"),
            "exact_key": features.column("exact_key"),
            "band_keys": features.column("band_keys"),
        }
    ).sort_by("id")


def publish_dedup_output(config, snapshot: str, rows: list[dict], keys: pa.Table) -> None:
    """A dedup output as the stage writes it for distinct documents (all kept, none excluded) with ``keys``:
    an earlier snapshot for incremental dedup, without a Spark run."""
    import pyarrow.parquet as pq

    from pipeline.core.storage import DatasetRef, StageOutput
    from pipeline.dedup.history import KEYS, keys_settings
    from pipeline.dedup.job import minhasher

    table = pa.Table.from_pylist(rows, schema=CLEAN_SCHEMA)
    with StageOutput(DatasetRef.of(config, "dedup", snapshot), config) as out:
        for part, content in (("documents", table), ("excluded", table.slice(0, 0)), (KEYS, keys)):
            (out.path / part).mkdir()
            pq.write_table(content, out.path / part / "part-00000.parquet")
        settings = keys_settings(minhasher(config.dedup, config.project.seed), config.dedup)
        out.commit(rows={"documents": len(rows)}, extra={"keys": {**settings, "documents": keys.num_rows}})
