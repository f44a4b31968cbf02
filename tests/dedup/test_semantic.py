"""Semantic dedup (SemDeDup): the per-cluster removal rule against a brute-force reference, and the stage
end to end in Spark on handwritten paraphrases, same-topic different-fact pairs and unrelated documents."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.storage import DatasetRef
from pipeline.dedup import job
from pipeline.dedup.semantic import semantic_removals
from pipeline.embeddings import EncoderConfig, encode
from pipeline.quality.funnel import funnel
from tests.conftest import make_config
from tests.dedup.synthetic import CLEAN_SCHEMA, document
from tests.dedup.test_dedup_stage import SNAPSHOT, data_checksums, publish_clean, read

# Written for this test: each pair says the same thing in other words. The bundled MiniLM encoder puts
# these pairs at cosine 0.74 ... 0.90.
PARAPHRASES = [
    (
        "The city council voted on Tuesday to build a new public library next to the central train station.",
        "On Tuesday, the members of the city council approved plans for a new public library beside the main railway station.",
    ),
    (
        "Regular exercise lowers the risk of heart disease and helps people sleep better at night.",
        "Working out regularly reduces the chance of developing heart disease and improves the quality of sleep.",
    ),
    (
        "To make the bread rise, mix the yeast with warm water and a spoon of sugar and wait ten minutes.",
        "Combine the yeast with warm water and a spoonful of sugar, then let it sit for ten minutes so the dough will rise.",
    ),
    (
        "The spacecraft entered orbit around Mars after a journey of seven months through the solar system.",
        "After travelling through the solar system for seven months, the probe went into orbit around Mars.",
    ),
    (
        "Python lists can grow and shrink at runtime, while tuples cannot be changed after they are created.",
        "In Python, a list may change its size while the program runs, but a tuple is immutable once it has been made.",
    ),
    (
        "The museum will be closed for renovation from March until the end of the summer.",
        "Because of renovation work, the museum is shut from March until summer is over.",
    ),
    (
        "Heavy rain caused the river to flood several villages, and hundreds of residents had to leave their homes.",
        "Several villages were flooded when the river overflowed after heavy rainfall, forcing hundreds of people to evacuate.",
    ),
    (
        "The company reported that its profits doubled in the last quarter thanks to strong sales in Asia.",
        "Thanks to strong demand in Asia, the firm said its quarterly profit was twice as high as before.",
    ),
    (
        "Bees pollinate many of the crops we eat, so their decline is a serious threat to agriculture.",
        "Many food crops depend on bees for pollination, which makes the falling number of bees a major danger for farming.",
    ),
    (
        "The striker scored twice in the second half and his team won the championship final.",
        "His team took the title after the forward netted two goals in the second half of the final.",
    ),
    (
        "Drink plenty of water on hot days to avoid dehydration and heat stroke.",
        "When the weather is hot, drinking a lot of water helps prevent dehydration and heatstroke.",
    ),
    (
        "The novel tells the story of a young woman who leaves her village to become a doctor in the capital.",
        "The book follows a young woman who moves from her home village to the capital city to train as a physician.",
    ),
]

# Same topic as one of the paraphrases above (the one at the index), different facts: these must stay.
# Cosine with that paraphrase 0.35 ... 0.64.
SAME_TOPIC = [
    "The city council voted on Tuesday against a plan to close the swimming pool near the central train station.",
    "To make the cake moist, add a cup of yogurt to the batter and bake it for forty minutes.",
    "The spacecraft landed on the Moon after a three-day journey and sent back pictures of the far side.",
    "Python dictionaries map keys to values, and since version 3.7 they keep the order in which keys were inserted.",
    "The goalkeeper saved a penalty in the first half but his team lost the championship final.",
    "The company reported that its profits fell by half in the last quarter because of weak sales in Europe.",
]

# Unrelated documents on varied topics (cosine at most 0.32 with anything here).
DISTINCT = [
    "Glaciers in the Alps have lost more than half of their volume since the middle of the nineteenth century.",
    "A binary search tree keeps its keys sorted so that lookups take logarithmic time when the tree is balanced.",
    "The violinist performed a sonata by Brahms at the concert hall, accompanied by a pianist from Vienna.",
    "Tomatoes need at least six hours of direct sunlight a day and should be watered at the base of the plant.",
    "The central bank raised interest rates by a quarter of a percentage point to fight inflation.",
    "Medieval castles were often built on hills so that defenders could see approaching armies from far away.",
    "The new smartphone has a larger battery, a faster processor and a camera that works well in low light.",
    "Octopuses can change the colour and texture of their skin in a fraction of a second to hide from predators.",
    "The marathon route passes through the old town, crosses two bridges and finishes in front of the cathedral.",
    "Vaccines train the immune system to recognise a virus without causing the disease itself.",
    "The poet wrote most of her sonnets during a long winter spent in a small house by the sea.",
    "Electric cars are cheaper to run than petrol cars, but their batteries are expensive to replace.",
    "In chess, castling moves the king two squares towards a rook and places the rook on the other side of the king.",
    "The desert receives less than ten centimetres of rain a year, yet many plants and animals survive there.",
    "A good cup of espresso depends on finely ground beans, the right water temperature and steady pressure.",
    "The treaty ended the war and redrew the borders of several countries in central Europe.",
    "Solar panels convert sunlight directly into electricity using layers of silicon cells.",
    "The children built a snowman in the park and decorated it with a scarf and an old hat.",
    "Compilers translate source code into machine instructions and can optimise loops to run faster.",
    "The hotel offers a view of the harbour, a rooftop swimming pool and free breakfast for guests.",
    "Wolves live in packs led by a breeding pair and hunt together over large territories.",
    "The election results will be announced tomorrow morning after all the ballots have been counted.",
    "Learning a second language as a child can make it easier to pick up a third one later in life.",
    "The earthquake damaged old buildings in the port, but the modern towers withstood the shaking.",
]
THRESHOLD = 0.7  # between the two measured bands above
SEMANTIC = (
    "dedup.semantic.enabled=true",
    f"dedup.semantic.threshold={THRESHOLD}",
    "dedup.semantic.clusters=2",
)
START = datetime(2026, 5, 1, tzinfo=UTC)


def build_corpus(seed: int = 7) -> tuple[pa.Table, dict]:
    """The documents above under random URLs (so random ids), shuffled, plus an exact copy of one of them."""
    rng = random.Random(seed)
    url = lambda: f"https://site{rng.randrange(1000)}.example/{rng.getrandbits(40):010x}"  # noqa: E731
    at = lambda: START + timedelta(minutes=rng.randrange(10_000))  # noqa: E731
    pairs = [(document(url(), a, at()), document(url(), b, at())) for a, b in PARAPHRASES]
    singles = [document(url(), text, at()) for text in SAME_TOPIC + DISTINCT]
    copy = document(url(), PARAPHRASES[0][1], at())
    rows = [row for pair in pairs for row in pair] + singles + [copy]
    rng.shuffle(rows)
    meta = {
        "pairs": [(a["id"], b["id"]) for a, b in pairs],
        "singles": [row["id"] for row in singles],
        "copy": (copy["id"], pairs[0][1]["id"]),
    }
    return pa.Table.from_pylist(rows, schema=CLEAN_SCHEMA), meta


def run_dedup(root: Path, table: pa.Table, partitions: int, *overrides: str):
    config = make_config(root, f"spark.shuffle_partitions={partitions}", *overrides)
    clean = publish_clean(config, table, files=partitions)
    return job.run(config, [clean], DatasetRef.of(config, "dedup", SNAPSHOT))


@pytest.fixture(scope="module", autouse=True)
def pyspark_ml_after_twisted():
    """pyspark.ml builds an estimator by reading every attribute its class lists (``Params._copy_params``).
    Once Twisted and zope.interface are loaded (the crawl tests import Scrapy into this same pytest process),
    a class can list a zope ``__provides__`` declaration that raises AttributeError when read through it, so
    KMeans() fails. A stage process never imports both. For this module the copy skips attributes that
    cannot be read, which are never Params."""
    from pyspark.ml.param import Param, Params

    original = Params._copy_params

    def copy_params(self) -> None:
        cls = type(self)
        for name in dir(cls):
            try:
                attribute = getattr(cls, name)
            except AttributeError:
                continue
            if isinstance(attribute, Param):
                setattr(self, name, attribute._copy_new_parent(self))

    Params._copy_params = copy_params
    yield
    Params._copy_params = original


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Semantic dedup on with 1 and 3 partitions (rows in another order), and off (the default)."""
    table, meta = build_corpus()
    reordered = table.take(random.Random(3).sample(range(table.num_rows), table.num_rows))
    manifests = {
        "p1": run_dedup(tmp_path_factory.mktemp("p1") / "data", table, 1, *SEMANTIC),
        "p3": run_dedup(tmp_path_factory.mktemp("p3") / "data", reordered, 3, *SEMANTIC),
    }
    with pytest.MonkeyPatch.context() as patch:
        # Off means off: the encoder and k-means are never reached.
        patch.setattr(job, "semantic_duplicates", lambda *args: pytest.fail("semantic dedup ran while off"))
        manifests["off"] = run_dedup(tmp_path_factory.mktemp("off") / "data", table, 3)
    return table, meta, manifests


@pytest.fixture(scope="module")
def cosine(runs):
    """Cosine of two documents by id, embedded here in the driver, independently of the Spark job."""
    table, _, _ = runs
    rows = table.to_pylist()
    vectors = encode([row["text"] for row in rows], EncoderConfig())
    index = {row["id"]: i for i, row in enumerate(rows)}
    return lambda x, y: float(vectors[index[x]] @ vectors[index[y]])


@pytest.mark.slow
def test_paraphrases_removed_one_of_each_kept_distinct_documents_all_kept(runs, cosine):
    _, meta, manifests = runs
    kept = {row["id"] for row in read(manifests["p1"], "documents")}
    excluded = {row["id"]: row["drop_reason"] for row in read(manifests["p1"], "excluded")}
    # The corpus is what it claims: every pair above the threshold, every other pair below it.
    for a, b in meta["pairs"]:
        assert cosine(a, b) > THRESHOLD
    everyone = [doc for pair in meta["pairs"] for doc in pair] + meta["singles"]
    partner = {a: b for a, b in meta["pairs"]} | {b: a for a, b in meta["pairs"]}
    for i, x in enumerate(everyone):
        for y in everyone[i + 1 :]:
            if partner.get(x) != y:
                assert cosine(x, y) < THRESHOLD - 0.02, (x, y)

    copy, original = meta["copy"]
    assert excluded[max(copy, original)] == "exact_duplicate"
    # Of the original and its exact copy, the smaller id goes on to semantic dedup in its place.
    survivor = {original: min(copy, original)}
    cluster = {row["id"]: row["cluster"] for row in read(manifests["p1"], "semantic_clusters")}
    together = [(survivor.get(a, a), survivor.get(b, b)) for a, b in meta["pairs"]]
    together = [(a, b) for a, b in together if cluster[a] == cluster[b]]
    for a, b in together:
        assert len({a, b} & kept) == 1, (a, b)
    # SemDeDup compares documents within a k-means cluster only, so a pair k-means splits stays whole (both
    # kept): the price of not comparing all pairs. On this corpus k-means (k=2) splits one pair of 12, the
    # football one; pipeline.dedup.semantic's rule itself is checked exactly below, on random vectors.
    assert len(together) >= len(meta["pairs"]) - 1
    assert set(meta["singles"]) <= kept
    semantic = {x for x, why in excluded.items() if why == "semantic_duplicate"}
    assert len(semantic) == len(together) == manifests["p1"].counters["dropped"]["semantic_duplicate"]
    assert semantic <= {x for pair in together for x in pair}


@pytest.mark.slow
def test_kept_set_and_records_do_not_depend_on_partitioning(runs):
    _, _, manifests = runs
    first, second = data_checksums(manifests["p1"]), data_checksums(manifests["p3"])
    assert any(path.startswith("semantic_duplicates/") for path in first)
    assert first == second
    assert manifests["p1"].counters["dropped"] == manifests["p3"].counters["dropped"]


@pytest.mark.slow
def test_every_removal_is_recorded_with_a_kept_representative_and_its_cosine(runs, cosine):
    table, _, manifests = runs
    manifest = manifests["p3"]
    kept = {row["id"] for row in read(manifest, "documents")}
    excluded = {row["id"]: row["drop_reason"] for row in read(manifest, "excluded")}
    removals = read(manifest, "semantic_duplicates")
    assert {row["id"] for row in removals} == {
        x for x, why in excluded.items() if why == "semantic_duplicate"
    }
    for row in removals:
        assert row["representative_id"] in kept
        assert row["cosine"] > THRESHOLD
        assert row["cosine"] == pytest.approx(cosine(row["id"], row["representative_id"]), abs=1e-4)
        # The rule: of a pair, the smaller id stays.
        assert row["representative_id"] < row["id"]
    # The exact copy's representative is the document that stays for it, also when that one lost to a
    # paraphrase: nothing points at a removed document.
    duplicates = read(manifest, "duplicates")
    assert {row["representative_id"] for row in duplicates} <= kept
    assert {row["id"] for row in duplicates if row["drop_reason"]} == set(excluded)

    counters = manifest.counters
    assert counters["input_documents"] == table.num_rows
    assert counters["kept"] + sum(counters["dropped"].values()) == counters["input_documents"]
    assert manifest.rows["semantic_duplicates"] == len(removals)
    assert counters["semantic_documents"] == table.num_rows - 1  # all but the exact copy
    assert manifest.rows["semantic_clusters"] == counters["semantic_documents"]
    assert counters["semantic_k"] == 2
    assert manifest.extra["semantic"]["threshold"] == THRESHOLD
    assert manifest.extra["semantic"]["embed_docs_per_second"] > 0
    assert "semantic.embed" in manifest.extra["step_seconds"]


@pytest.mark.slow
def test_funnel_adds_up_with_semantic_duplicates(runs):
    table, _, manifests = runs
    manifest = manifests["p1"]
    steps = funnel(manifest)  # from the clean manifest (its documents are dedup's input) to dedup's kept
    assert steps[-1].reason == "kept" and steps[-1].documents == manifest.counters["kept"]
    drops = steps[:-1]
    assert {step.stage for step in drops} == {"dedup"}
    assert {step.reason: step.documents for step in drops} == manifest.counters["dropped"]
    assert "semantic_duplicate" in {step.reason for step in drops}
    assert sum(step.documents for step in drops) + steps[-1].documents == table.num_rows


@pytest.mark.slow
def test_off_by_default_changes_nothing(runs):
    _, _, manifests = runs
    on, off = manifests["p3"], manifests["off"]
    assert not any(path.startswith("semantic_duplicates/") for path in data_checksums(off))
    assert "semantic" not in off.extra and not any(key.startswith("semantic") for key in off.counters)
    assert set(off.rows) == {"documents", "excluded", "duplicates"}
    assert off.counters["dropped"] == {"exact_duplicate": 1}
    removed = {row["id"] for row in read(on, "semantic_duplicates")}
    kept_on = {row["id"] for row in read(on, "documents")}
    kept_off = {row["id"] for row in read(off, "documents")}
    assert kept_off == kept_on | removed


def brute_force_removals(
    ids: list[str], vectors: np.ndarray, threshold: float
) -> dict[str, tuple[str, float]]:
    """The rule spelled out: in id order, a document goes when it is above the threshold with a kept
    earlier one; it points at the most similar kept one (ties: the smaller id)."""
    by_id = dict(zip(ids, vectors.astype(np.float64), strict=True))
    kept: list[str] = []
    removed = {}
    for doc in sorted(ids):
        scores = [
            (sum(float(a) * float(b) for a, b in zip(by_id[doc], by_id[k], strict=True)), k) for k in kept
        ]
        above = [(c, k) for c, k in scores if c > threshold]
        if above:
            best = max(c for c, _ in above)
            removed[doc] = (min(k for c, k in above if c == best), best)
        else:
            kept.append(doc)
    return removed


def planted_vectors(seed: int, n: int, dim: int, centres: int, spread: float) -> np.ndarray:
    """Unit vectors around a few centres, so many pairs fall on both sides of a threshold; some exact copies."""
    rng = np.random.default_rng(seed)
    centre = rng.normal(size=(centres, dim))
    vectors = centre[rng.integers(0, centres, n)] + spread * rng.normal(size=(n, dim))
    copies = rng.integers(0, n, n // 5)
    vectors[rng.integers(0, n, len(copies))] = vectors[copies]
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 60),
    dim=st.integers(2, 12),
    centres=st.integers(1, 5),
    spread=st.floats(0.05, 1.5),
    threshold=st.floats(0.3, 0.99),
    block_rows=st.integers(1, 9),
)
def test_removal_rule_matches_brute_force(seed, n, dim, centres, spread, threshold, block_rows):
    rng = random.Random(seed)
    ids = [f"{rng.getrandbits(48):012x}{i}" for i in range(n)]
    vectors = planted_vectors(seed, n, dim, centres, spread)
    removed, representatives, cosines = semantic_removals(ids, vectors, threshold, block_rows=block_rows)
    got = {ids[r]: (ids[p], c) for r, p, c in zip(removed, representatives, cosines, strict=True)}
    expected = brute_force_removals(ids, vectors, threshold)
    assert got.keys() == expected.keys()
    for doc, (rep, cos) in got.items():
        assert rep == expected[doc][0]
        assert cos == pytest.approx(expected[doc][1], abs=1e-9)
    # What the rule guarantees: every removed document points at a kept one, above the threshold, and
    # no two kept documents are above it with each other.
    kept = [i for i in range(n) if ids[i] not in got]
    assert all(ids[representatives[k]] not in got for k in range(len(removed)))
    if kept:
        gram = vectors[kept] @ vectors[kept].T
        np.fill_diagonal(gram, -1)
        assert gram.max() <= threshold + 1e-9


@given(seed=st.integers(0, 2**32 - 1), block_rows=st.integers(1, 9))
def test_removal_rule_ignores_row_order(seed, block_rows):
    rng = random.Random(seed)
    ids = [f"doc-{rng.getrandbits(32):08x}-{i}" for i in range(40)]
    vectors = planted_vectors(seed, 40, 6, 3, 0.3)
    removed, representatives, _ = semantic_removals(ids, vectors, 0.8, block_rows=block_rows)
    order = rng.sample(range(40), 40)
    shuffled = semantic_removals([ids[i] for i in order], vectors[order], 0.8, block_rows=block_rows)
    expected = {(ids[r], ids[p]) for r, p in zip(removed, representatives, strict=True)}
    moved = {(ids[order[r]], ids[order[p]]) for r, p in zip(shuffled[0], shuffled[1], strict=True)}
    assert moved == expected


def test_empty_and_single_cluster_inputs():
    assert semantic_removals([], np.empty((0, 4)), 0.9) == ([], [], [])
    assert semantic_removals(["a"], np.ones((1, 4)) / 2, 0.9) == ([], [], [])
    same = np.tile(np.array([[0.6, 0.8]]), (3, 1))
    removed, representatives, cosines = semantic_removals(["c", "a", "b"], same, 0.99)
    assert sorted(removed) == [0, 2] and representatives == [1, 1]
    assert cosines == pytest.approx([1.0, 1.0])


@pytest.mark.slow
def test_empty_input_with_semantic_on_gives_empty_outputs(tmp_path):
    manifest = run_dedup(tmp_path / "data", CLEAN_SCHEMA.empty_table(), 2, *SEMANTIC)
    assert manifest.rows == {
        "documents": 0,
        "excluded": 0,
        "duplicates": 0,
        "semantic_duplicates": 0,
        "semantic_clusters": 0,
    }
    assert manifest.counters["semantic_documents"] == 0 and manifest.counters["dropped"] == {}
