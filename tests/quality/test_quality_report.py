import gzip
import json
import math
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.spark import spark_session
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.embeddings import EncoderConfig, embed_batches
from pipeline.quality.report import (
    cluster_entropy,
    collect_sample,
    cosine_statistics,
    coverage,
    host_concentration,
    kmeans_labels,
    run,
    sample_documents,
)


def test_cosine_statistics_match_a_loop_reference():
    rng = np.random.default_rng(4)
    vectors = rng.normal(size=(9, 16))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    stats = cosine_statistics(vectors)
    pairs = [float(vectors[i] @ vectors[j]) for i in range(9) for j in range(9) if i != j]
    nearest = [max(float(vectors[i] @ vectors[j]) for j in range(9) if j != i) for i in range(9)]
    assert stats["mean_pairwise_cosine"] == pytest.approx(sum(pairs) / len(pairs))
    assert stats["mean_nearest_neighbour_cosine"] == pytest.approx(sum(nearest) / 9)
    assert cosine_statistics(vectors[:1])["mean_pairwise_cosine"] is None


@given(st.lists(st.integers(1, 1000), min_size=1, max_size=30))
def test_host_concentration_bounds(counts):
    stats = host_concentration(counts)
    total = sum(counts)
    assert stats["hosts"] == len(counts)
    assert stats["host_herfindahl_index"] == pytest.approx(sum((c / total) ** 2 for c in counts))
    assert 0.0 <= stats["host_entropy_normalised"] <= 1.0 + 1e-9
    assert stats["top10_host_share"] == pytest.approx(sum(sorted(counts, reverse=True)[:10]) / total)


def test_cluster_entropy_separates_even_and_lopsided_topics():
    rng = np.random.default_rng(5)
    centres = rng.normal(size=(4, 8)) * 20
    even = np.concatenate([centre + rng.normal(size=(25, 8)) for centre in centres])
    lopsided = np.concatenate(
        [centres[0] + rng.normal(size=(97, 8)), *[c + rng.normal(size=(1, 8)) for c in centres[1:]]]
    )
    assert cluster_entropy(even, 4, seed=0)["cluster_entropy"] == pytest.approx(1.0, abs=1e-6)
    assert cluster_entropy(lopsided, 4, seed=0)["cluster_entropy"] < 0.3


@given(st.integers(0, 2**32 - 1), st.integers(2, 6), st.integers(3, 30))
def test_kmeans_recovers_well_separated_blobs_and_is_seeded(seed, k, per_blob):
    """The blobs drawn are the reference partition: any labelling that splits one or merges two fails."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, 6)) * 1_000
    points = np.concatenate([centre + rng.normal(size=(per_blob, 6)) for centre in centres])
    labels = kmeans_labels(points, k, seed=seed % 7)
    truth = np.repeat(np.arange(k), per_blob)
    # One label per blob, and k labels in all: no blob split, none merged with another.
    assert (
        len({(int(a), int(b)) for a, b in zip(labels, truth, strict=True)}) == k == len(set(labels.tolist()))
    )
    assert np.array_equal(kmeans_labels(points, k, seed=seed % 7), labels)


@pytest.mark.slow
def test_coverage_counts_hosts_and_languages_as_a_loop_does(config):
    """Random documents with null domains, languages and texts among them, against plain Python counts; with
    and without a lang column."""
    import random

    rng = random.Random(11)
    rows = [
        {
            "domain": rng.choice(["a.org", "b.org", "c.net", "ünï.de", None]),
            "lang": rng.choice(["en", "zh", None]),
            "text": rng.choice([None, "x" * rng.randint(0, 50)]),
        }
        for _ in range(300)
    ]
    spark = spark_session(config, "coverage-test")
    frame = spark.createDataFrame(rows, "domain string, lang string, text string")
    for docs, with_lang in [(frame, True), (frame.drop("lang"), False)]:
        from pyspark.sql import functions as F

        found = coverage(docs.withColumn("n_chars", F.length("text")))
        hosts: dict = {}
        for row in rows:
            host = hosts.setdefault(
                row["domain"], {"domain": row["domain"], "documents": 0, "characters": None}
            )
            host["documents"] += 1
            if row["text"] is not None:
                host["characters"] = (host["characters"] or 0) + len(row["text"])
        by_count = sorted(hosts.values(), key=lambda h: h["domain"] or "")  # None sorts with "" first
        assert found.hosts == sorted(by_count, key=lambda h: -h["documents"])
        languages: dict = {}
        for row in rows:
            languages[str(row["lang"])] = languages.get(str(row["lang"]), 0) + 1
        assert found.languages == (languages if with_lang else {})
        assert found.documents == len(rows)
        assert found.characters == sum(len(row["text"]) for row in rows if row["text"] is not None)


@pytest.mark.slow
def test_embeddings_rank_repetitive_text_as_less_diverse():
    varied = [
        "The river turned the mill wheel all winter.",
        "Quantum computers use qubits to represent information.",
        "Add flour and water to feed the sourdough starter.",
        "The chess opening controls the centre of the board.",
    ]
    repetitive = [f"The river turned the mill wheel all winter, day {i}." for i in range(4)]

    def embed(texts):
        batch = pa.RecordBatch.from_pydict(
            {"id": [str(i) for i in range(len(texts))], "domain": ["d"] * len(texts), "text": texts}
        )
        (out,) = embed_batches(
            iter([batch]), EncoderConfig(max_seq_length=64, batch_size=8), keep=("id", "domain")
        )
        return np.array(out.column("embedding").to_pylist())

    varied_vectors, repetitive_vectors = embed(varied), embed(repetitive)
    np.testing.assert_allclose(np.linalg.norm(varied_vectors, axis=1), 1.0, rtol=1e-5)
    assert (
        cosine_statistics(repetitive_vectors)["mean_pairwise_cosine"]
        > cosine_statistics(varied_vectors)["mean_pairwise_cosine"] + 0.3
    )


@pytest.mark.slow
def test_quality_stage_report_matches_independent_recomputation(sample_corpus):
    config, snapshot = sample_corpus
    clean = DatasetRef.of(config, "clean", snapshot)
    # An earlier report on the corpus (its name sorts first), for the comparison and the trend plot.
    earlier = DatasetRef.of(config, "quality", "0-earlier")
    with StageOutput(earlier, config, []) as out:
        (out.path / "metrics.json").write_text(
            json.dumps({"documents": 1, "self_bleu": 99.0, "vendi_score": 1.0})
        )
        out.commit()

    manifest = run(config, [clean], DatasetRef.of(config, "quality", snapshot))
    folder = DatasetRef.of(config, "quality", snapshot).path
    metrics = json.loads((folder / "metrics.json").read_text())
    documents = pq.read_table(clean.path / "documents").to_pylist()

    assert metrics == manifest.extra["metrics"]
    assert metrics["documents"] == len(documents) == metrics["sampled_documents"]
    assert metrics["characters"] == sum(len(d["text"]) for d in documents)
    # Spark's exact percentile interpolates linearly between ranks, as numpy's default does.
    lengths = [len(d["text"]) for d in documents]
    assert metrics["length_p10_p50_p90_p99"] == pytest.approx(list(np.percentile(lengths, [10, 50, 90, 99])))
    assert metrics["hosts"] == 1 and metrics["host_herfindahl_index"] == 1.0
    words = [re.findall(r"\w+", d["text"].lower()) for d in documents]
    unigrams = [w for ws in words for w in ws]
    assert metrics["distinct_1gram_ratio"] == pytest.approx(len(set(unigrams)) / len(unigrams))

    embeddings = pq.read_table(folder / "embeddings.parquet")
    vectors = np.array(embeddings.column("embedding").to_pylist())
    assert sorted(embeddings.column("id").to_pylist()) == sorted(d["id"] for d in documents)
    assert metrics["mean_pairwise_cosine"] == pytest.approx(
        cosine_statistics(vectors)["mean_pairwise_cosine"], abs=1e-6
    )
    # Embedded again (the same rows, another shuffle): the same vectors to the last bit.
    from pyspark.sql import functions as F

    spark = spark_session(config, "quality-test")
    docs = spark.read.parquet(str(clean.path / "documents")).withColumn("n_chars", F.length("text"))
    again = collect_sample(sample_documents(docs, config), config.quality.encoder)
    assert again.ids == embeddings.column("id").to_pylist()
    assert np.array_equal(
        again.embeddings, np.array(embeddings.column("embedding").to_pylist(), dtype=np.float32)
    )

    # Vendi from the saved vectors, by its definition: exp(entropy of the eigenvalues of K/n).
    eigenvalues = np.clip(np.linalg.eigvalsh(vectors @ vectors.T / len(vectors)), 0, None)
    eigenvalues = eigenvalues[eigenvalues > 1e-12]
    assert metrics["vendi_score"] == pytest.approx(
        np.exp(-(eigenvalues * np.log(eigenvalues)).sum()), rel=1e-4
    )
    ratios = [len(gzip.compress(d["text"].encode(), 9, mtime=0)) / len(d["text"].encode()) for d in documents]
    assert metrics["compression_ratio_mean"] == pytest.approx(np.mean(ratios))
    assert 0 <= metrics["self_bleu"] <= 100 and 0 < metrics["bertscore_f1"] <= 1
    assert not math.isnan(metrics["cluster_entropy"])

    # Subjects: every sampled document has one, and the shares add up with the unassigned bucket.
    assigned = embeddings.column("subject").to_pylist()
    assert len(assigned) == len(documents) and all(assigned)
    shares = sum(row["share"] for row in metrics["subjects"].values()) + metrics["unassigned_share"]
    assert shares == pytest.approx(1.0)
    for name, row in metrics["subjects"].items():
        assert row["documents"] == assigned.count(name)

    # Across snapshots: compared with the earlier report.
    assert manifest.extra["previous_snapshot"] == "0-earlier"
    html = (folder / "report.html").read_text()
    assert "Compared with snapshot <b>0-earlier</b>" in html
    assert {p.name for p in (folder / "plots").iterdir()} == {
        "subjects.png",
        "compression.png",
        "embeddings_pca.png",
        "funnel.png",
        "trends.png",
        "hosts.png",
        "lengths.png",
    }
    assert html.count("data:image/png;base64,") == 7
    for heading in ("Subjects", "Diversity", "Drop funnel", "Across snapshots", "Hosts"):
        assert f"<h2>{heading}</h2>" in html
    clean_counters = clean.manifest().counters
    assert metrics["funnel_languages"]["en"]["kept"] == clean_counters["kept_by_language"]["en"]
    assert sum(row["dropped"] for row in metrics["funnel_languages"].values()) == sum(
        clean_counters["dropped"].values()
    )
    assert metrics["pii_redacted"] == clean_counters["pii_redacted"] and "PII redacted" in html
    funnel = metrics["funnel"]
    assert funnel[-1]["reason"] == "kept" and funnel[-1]["documents"] == len(documents)
    assert funnel[0]["documents"] == sum(step["documents"] for step in funnel[1:])
