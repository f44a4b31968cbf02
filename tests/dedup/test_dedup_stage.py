"""The dedup stage end to end on a planted corpus, checked against exact ground truth."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.dedup import job
from tests.conftest import make_config
from tests.dedup import reference
from tests.dedup.synthetic import (
    CLEAN_SCHEMA,
    WordSource,
    as_text,
    document,
    plain_jaccard,
    planted_corpus,
)

SNAPSHOT = "s1"
THRESHOLD = 0.8
LEVELS = (0.5, 0.7, 0.8, 0.9, 1.0)
CJK = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安场身车例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集温传土许步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连断深难近矿千周委素技备半办青省列习响约支般史感劳便团往酸历市克何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型眼王按格养易置派层片始却专状育厂京识适属圆包火住调满县局照参红细引听该铁价严"


def cjk_text(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(CJK) for _ in range(length))


def build_corpus(seed: int = 11) -> tuple[pa.Table, dict]:
    """Planted near-duplicates at LEVELS plus the hard cases; returns the table and what was planted."""
    rng = random.Random(seed)
    planted = planted_corpus(150, seed, levels=LEVELS, copy_fraction=0.4, words=(60, 160))
    rows = list(planted.rows)
    source = WordSource(rng, 3000)
    start = datetime(2026, 3, 1, tzinfo=UTC)
    at = lambda hours: start + timedelta(hours=hours)  # noqa: E731

    # Transitive: A~B and B~C above the threshold, A and C below it.
    a = source.draw(120)
    b = a[:20] + source.draw(6) + a[26:]
    c = b[:94] + source.draw(6) + b[100:]
    chain = [
        document(f"https://chain.example/{name}", " ".join(body), at(1))
        for name, body in zip("abc", (a, b, c), strict=True)
    ]
    rows += chain

    # A crowd: 40 one-word edits of one text share most buckets. Links go to each bucket's smallest id,
    # so candidate pairs grow like n, not n^2.
    crowd_base = source.draw(200)
    crowd = []
    for i in range(41):
        body = list(crowd_base)
        if i:
            body[rng.randrange(200)] = source.draw(1)[0]
        crowd.append(document(f"https://crowd.example/{i}", " ".join(body), at(1)))
    rows += crowd

    # Short documents: fewer tokens than the n-gram size. Distinct ones stay; equal tokens are exact dups.
    shorts = [
        "hello world",
        "Hello, World!",
        "goodbye world",
        "one",
        "two words",
        "a b c d",
        "x y",
        "!!!",
        "???",
    ]
    shorts += ["???", "東京"]
    rows += [document(f"https://short.example/{i}", text, at(2)) for i, text in enumerate(shorts)]

    # CJK: character 5-grams.
    base = cjk_text(rng, 150)
    cjk_copies = [base, base[:60] + cjk_text(rng, 4) + base[64:], base[:10] + cjk_text(rng, 40) + base[50:]]
    cjk_copies.append(cjk_text(rng, 150))
    rows += [
        document(f"https://cjk.example/{i}", text, at(3), lang="zh") for i, text in enumerate(cjk_copies)
    ]

    # URL duplicates: the same page under cosmetic URL variants, fetched at different times.
    page_old = as_text(source.draw(80), rng)
    page_new = as_text(source.draw(80), rng)
    old = document("https://www.news.example/story/?utm_source=feed", page_old, at(4))
    new = document("http://news.example/story", page_new, at(30))
    rows += [old, new]

    # A null text is quarantined with its reason.
    broken = document("https://broken.example/1", "", at(5))
    broken["text"] = None
    rows.append(broken)
    rng.shuffle(rows)
    meta = {
        "chain": [row["id"] for row in chain],
        "crowd": [row["id"] for row in crowd],
        "url_old": old["id"],
        "url_new": new["id"],
        "null_text": broken["id"],
        "short_ids": {row["id"] for row in rows if row["url"].startswith("https://short.example/")},
    }
    return pa.Table.from_pylist(rows, schema=CLEAN_SCHEMA), meta


def publish_clean(config, table: pa.Table, files: int) -> DatasetRef:
    ref = DatasetRef.of(config, "clean", SNAPSHOT)
    with StageOutput(ref, config, []) as out:
        folder = out.path / "documents"
        folder.mkdir()
        size = -(-table.num_rows // files) if table.num_rows else 0
        for index in range(files):
            pq.write_table(table.slice(index * size, size), folder / f"part-{index:05d}.parquet")
        out.commit(rows={"documents": table.num_rows})
    return ref


def run_dedup(root: Path, table: pa.Table, partitions: int, *overrides: str):
    config = make_config(root, f"spark.shuffle_partitions={partitions}", *overrides)
    clean = publish_clean(config, table, files=partitions)
    return job.run(config, [clean], DatasetRef.of(config, "dedup", SNAPSHOT))


def read(manifest, name) -> list[dict]:
    return pq.read_table(Path(manifest.path) / name).to_pylist()


def data_checksums(manifest) -> dict:
    return {path: entry.sha256 for path, entry in manifest.files.items() if not path.endswith(".json")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The stage on the same corpus with 1, 3 and 8 partitions, and 3 again."""
    table, meta = build_corpus()
    manifests = {}
    for name, partitions in (("p1", 1), ("p3", 3), ("p8", 8), ("p3-again", 3)):
        manifests[name] = run_dedup(tmp_path_factory.mktemp(name) / "data", table, partitions)
    return table, meta, manifests


def ground_truth(table: pa.Table, meta: dict):
    """Exact all-pairs Jaccard over the documents URL dedup keeps; components of pairs >= THRESHOLD.

    Documents without any token have no shingles: only equal raw texts make them duplicates.
    """
    docs = [row for row in table.to_pylist() if row["text"] is not None and row["id"] != meta["url_old"]]
    shingle_sets = {row["id"]: set(reference.shingles(row["text"])) for row in docs}
    texts = {row["id"]: row["text"] for row in docs}
    union = reference.UnionFind()
    pairs = {}
    ids = sorted(shingle_sets)
    for i, x in enumerate(ids):
        union.find(x)
        for y in ids[i + 1 :]:
            sx, sy = shingle_sets[x], shingle_sets[y]
            if not sx and not sy:
                if texts[x] == texts[y]:
                    union.union(x, y)
                continue
            similarity = len(sx & sy) / len(sx | sy)
            if similarity > 0:
                pairs[(x, y)] = similarity
            if similarity >= THRESHOLD:
                union.union(x, y)
    return union.components(), pairs, texts


@pytest.mark.slow
def test_same_bytes_for_1_3_8_partitions_and_across_runs(runs):
    _, _, manifests = runs
    reference_files = data_checksums(manifests["p1"])
    assert any(path.startswith("documents/") for path in reference_files)
    assert any(path.startswith("duplicates/") for path in reference_files)
    for name in ("p3", "p8", "p3-again"):
        assert data_checksums(manifests[name]) == reference_files, name
        assert manifests[name].counters["dropped"] == manifests["p1"].counters["dropped"]


@pytest.mark.slow
def test_clusters_match_exact_ground_truth(runs):
    table, meta, manifests = runs
    manifest = manifests["p3"]
    truth, pairs, texts = ground_truth(table, meta)
    duplicates = read(manifest, "duplicates")
    predicted = {row["id"]: row["representative_id"] for row in duplicates}
    predicted_rep = lambda doc: predicted.get(doc, doc)  # noqa: E731

    # Precision: verified clusters never join documents that are not truly connected at >= 0.8.
    for doc, rep in predicted.items():
        if doc != meta["url_old"]:
            assert truth[doc] == truth[rep], (doc, rep)

    # Recall: every true pair at >= 0.9 is clustered; pairs in [0.8, 0.9) nearly all (P(found) ~ 0.95 each).
    strong = [(x, y) for (x, y), s in pairs.items() if s >= 0.9]
    borderline = [(x, y) for (x, y), s in pairs.items() if THRESHOLD <= s < 0.9]
    assert len(strong) >= 10 and len(borderline) >= 10, "the corpus plants pairs on both sides of 0.9"
    for x, y in strong:
        assert predicted_rep(x) == predicted_rep(y), (x, y, pairs[(x, y)])
    found = sum(predicted_rep(x) == predicted_rep(y) for x, y in borderline)
    assert found >= 0.8 * len(borderline)

    # Planted levels below the threshold exist, and no such pair alone made a cluster.
    below = [(x, y) for (x, y), s in pairs.items() if 0.45 <= s < THRESHOLD]
    assert len(below) >= 10
    for x, y in below:
        if truth[x] != truth[y]:
            assert predicted_rep(x) != predicted_rep(y)

    # The representative is the smallest id of its true component, when the whole component was found.
    for doc, rep in predicted.items():
        if doc not in truth:
            continue  # the URL duplicate: its representative is the newest fetch, checked elsewhere
        members = [d for d in truth if truth[d] == truth[doc]]
        if all(predicted_rep(d) == rep for d in members):
            assert rep == min(members)

    # similarity is the exact Jaccard with the representative, computed independently here.
    for row in duplicates:
        if row["id"] in texts and row["representative_id"] in texts:
            expected = reference.jaccard(texts[row["id"]], texts[row["representative_id"]])
            assert row["similarity"] == pytest.approx(expected, abs=1e-12), row


@pytest.mark.slow
def test_transitive_short_cjk_url_and_null_cases(runs):
    table, meta, manifests = runs
    manifest = manifests["p8"]
    excluded = {row["id"]: row for row in read(manifest, "excluded")}
    kept = {row["id"]: row for row in read(manifest, "documents")}
    duplicates = {row["id"]: row for row in read(manifest, "duplicates")}
    texts = {row["id"]: row["text"] for row in table.to_pylist()}

    a, b, c = meta["chain"]
    assert reference.jaccard(texts[a], texts[b]) >= THRESHOLD
    assert reference.jaccard(texts[b], texts[c]) >= THRESHOLD
    assert reference.jaccard(texts[a], texts[c]) < THRESHOLD
    rep = min(a, b, c)
    assert rep in kept and {a, b, c} - {rep} <= set(excluded)
    assert {duplicates[x]["cluster_id"] for x in (a, b, c)} == {rep}

    crowd = meta["crowd"]
    assert {duplicates[x]["cluster_id"] for x in crowd} == {min(crowd)}
    assert manifest.counters["largest_bucket"] >= 30
    assert manifest.counters["candidate_pairs"] < len(crowd) * (len(crowd) - 1) // 2

    # Short documents: only the equal-token pairs are removed, as exact duplicates.
    short_removed = meta["short_ids"] & set(excluded)
    assert len(short_removed) == 2
    assert {excluded[x]["drop_reason"] for x in short_removed} == {"exact_duplicate"}
    assert {texts[x] for x in short_removed} <= {"hello world", "Hello, World!", "???"}
    assert manifest.counters["documents_without_tokens"] == 3  # "!!!", "???", "???"
    assert manifest.counters["documents_with_one_shingle"] >= 8

    # CJK: character n-grams find the 4-character edit but not the 40-character one.
    cjk = sorted(
        (row for row in table.to_pylist() if row["url"].startswith("https://cjk.example/")),
        key=lambda r: r["url"],
    )
    cjk_ids = [row["id"] for row in cjk]
    j01 = reference.jaccard(cjk[0]["text"], cjk[1]["text"])
    j02 = reference.jaccard(cjk[0]["text"], cjk[2]["text"])
    assert j01 >= 0.85 and j02 < 0.6
    assert {cjk_ids[0], cjk_ids[1]} & set(excluded) and min(cjk_ids[0], cjk_ids[1]) in kept
    assert cjk_ids[3] in kept and cjk_ids[2] in kept

    # URL dedup keeps the newest fetch; the representative is the newer page.
    assert excluded[meta["url_old"]]["drop_reason"] == "url_duplicate"
    assert duplicates[meta["url_old"]]["representative_id"] == meta["url_new"]
    assert meta["url_new"] in kept

    # Null text is quarantined with its reason, nothing disappears, columns pass through unchanged.
    assert excluded[meta["null_text"]]["drop_reason"] == "null_text"
    assert set(kept) | set(excluded) == set(texts) and not set(kept) & set(excluded)
    documents_schema = pq.read_schema(next((Path(manifest.path) / "documents").glob("*.parquet")))
    assert documents_schema.names == CLEAN_SCHEMA.names
    assert all(kept[x]["lang"] in {"en", "zh"} for x in kept)

    counters = manifest.counters
    reasons = {}
    for row in excluded.values():
        reasons[row["drop_reason"]] = reasons.get(row["drop_reason"], 0) + 1
    assert counters["dropped"] == reasons
    assert counters["kept"] == len(kept) == manifest.rows["documents"]
    assert counters["input_documents"] == table.num_rows
    assert counters["clusters"] == len({row["cluster_id"] for row in duplicates.values()})
    assert counters["dropped_bytes"]["exact_duplicate"] == sum(
        len(texts[x].encode()) for x, row in excluded.items() if row["drop_reason"] == "exact_duplicate"
    )
    chars = {}
    for x, row in excluded.items():
        chars[row["drop_reason"]] = chars.get(row["drop_reason"], 0) + len(texts[x] or "")
    assert counters["dropped_chars"] == chars  # the drop funnel's characters
    assert counters["kept_chars"] == sum(len(texts[x]) for x in kept)
    assert counters["input_chars"] == counters["kept_chars"] + sum(chars.values())
    assert counters["rejected_by_verification"] > 0, "planted 0.5-0.7 pairs collide and are verified away"
    assert (Path(manifest.path) / "lsh_s_curve.png").is_file()


@pytest.mark.slow
def test_texts_are_compared_again_only_when_some_pair_may_differ(tmp_path, monkeypatch):
    """On a snapshot without band collisions whose only duplicates are exact, no text is read a second time
    (no Python scoring pass, no components' jobs: most of a small snapshot's cost); add a URL duplicate with
    other text and it is scored, against a plain Jaccard. Random texts, so a skip that hides a pair fails."""
    scored_calls: list[int] = []
    real = job.pair_similarity
    monkeypatch.setattr(job, "pair_similarity", lambda *args: scored_calls.append(1) or real(*args))
    rng = random.Random(23)
    source = WordSource(rng, size=5_000)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    texts = [as_text(source.draw(rng.randint(80, 160)), rng) for _ in range(12)]
    rows = [document(f"https://site.example/{i}", text, start) for i, text in enumerate(texts)]
    rows.append(document("https://mirror.example/copy", texts[3], start))  # an exact duplicate of 3
    manifest = run_dedup(tmp_path / "exact", pa.Table.from_pylist(rows, schema=CLEAN_SCHEMA), 2)
    assert scored_calls == []
    assert manifest.counters["candidate_pairs"] == 0 and manifest.counters["components_rounds"] == 0
    assert manifest.counters["dropped"] == {"exact_duplicate": 1}
    assert {row["id"]: row["similarity"] for row in read(manifest, "duplicates")} == {
        rows[3]["id"]: 1.0,
        rows[-1]["id"]: 1.0,
    }

    refetched = as_text(source.draw(120), rng)  # the page fetched again a day later, rewritten
    rows.append(document("https://site.example/5?utm_source=feed", refetched, start + timedelta(days=1)))
    manifest = run_dedup(tmp_path / "url", pa.Table.from_pylist(rows, schema=CLEAN_SCHEMA), 2)
    assert scored_calls, "a URL duplicate's text differs from its representative's: it must be compared"
    assert manifest.counters["dropped"] == {"exact_duplicate": 1, "url_duplicate": 1}
    similarity = {row["id"]: row["similarity"] for row in read(manifest, "duplicates")}
    assert similarity[rows[5]["id"]] == pytest.approx(plain_jaccard(texts[5], refetched))
    assert similarity[rows[-1]["id"]] == 1.0


@pytest.mark.slow
def test_empty_input_gives_empty_outputs(tmp_path):
    manifest = run_dedup(tmp_path / "data", CLEAN_SCHEMA.empty_table(), 2)
    assert manifest.rows == {"documents": 0, "excluded": 0, "duplicates": 0}
    assert manifest.counters["input_documents"] == 0 and manifest.counters["clusters"] == 0
    assert pq.read_table(Path(manifest.path) / "documents").schema.names == CLEAN_SCHEMA.names
    assert "drop_reason" in pq.read_table(Path(manifest.path) / "excluded").schema.names


@pytest.mark.slow
def test_bad_ids_and_missing_columns_fail_clearly(tmp_path, capsys):
    rows = [
        document(
            f"https://e.example/{i}", f"text number {i} with some words", datetime(2026, 1, 1, tzinfo=UTC)
        )
        for i in range(6)
    ]
    null_id = pa.Table.from_pylist([*rows[:3], {**rows[3], "id": None}], schema=CLEAN_SCHEMA)
    with pytest.raises(job.DedupInputError, match=r"1 input row.* null id"):
        run_dedup(tmp_path / "a", null_id, 2)

    repeated = pa.Table.from_pylist([*rows, rows[0]], schema=CLEAN_SCHEMA)
    config = make_config(tmp_path / "b")
    publish_clean(config, repeated, 2)
    code = cli.main(
        [
            "dedup",
            "--snapshot",
            SNAPSHOT,
            "--set",
            f"project.data_root={tmp_path / 'b'}",
            "--set",
            "logging.console=false",
        ]
    )
    assert code == 2
    assert "repeat another row's id" in capsys.readouterr().err
    assert not DatasetRef.of(config, "dedup", SNAPSHOT).is_complete(), "nothing is published on failure"

    no_url = pa.Table.from_pylist(rows, schema=CLEAN_SCHEMA).drop_columns(["url"])
    with pytest.raises(job.DedupInputError, match="url_dedup=false"):
        run_dedup(tmp_path / "c", no_url, 2)
    manifest = run_dedup(tmp_path / "d", no_url, 2, "dedup.url_dedup=false")
    assert manifest.rows["documents"] == 6


def test_cli_help_and_missing_input(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["dedup", "--help"])
    assert exit_info.value.code == 0
    assert "near-duplicate" in capsys.readouterr().out
    code = cli.main(["dedup", "--snapshot", "nothing-here", "--set", f"project.data_root={tmp_path}"])
    assert code == 2
    assert "pretrain clean --snapshot nothing-here" in capsys.readouterr().err
