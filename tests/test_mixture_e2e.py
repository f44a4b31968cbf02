"""A mixture end to end: two corpora (a crawl and an ingest), five snapshots in all, one tokenizer, trained
through `pretrain train` (torchrun, 2 ranks, resuming a 1-rank run stopped part way), exported, evaluated
and reported; the model card, run.json, the MLflow run and the registered version list every input.

The crawl's first snapshot is the real crawl -> clean -> tokenize output of the bundled site (the session's
``sample_corpus``, copied, with the tokenizer its tokenize stage stored). The ingest corpus's first snapshot
is made by the corpus stages from a JSONL file (ingest, clean, dedup, classify, decontaminate, tokenize), its
tokenize told to use the crawl corpus's stored tokenizer (``tokenize.tokenizer=site/NAME``), as a second
corpus shares a first one's. The other three are generated text encoded with that tokenizer's files, as the
tokenize stage encodes every snapshot of a corpus with its stored tokenizer (tested on its own in
tests/tokenization/test_shared_tokenizer.py), so all five carry one tokenizer digest.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from mlflow.tracking import MlflowClient

from pipeline.core.storage import DatasetRef
from pipeline.train.fault_injection import ENV_FAULT
from pipeline.train.trainer import EXIT_STOPPED, train
from tests.train.support import (
    finish,
    losses,
    pretrain_train,
    single_process,
    start,
    train_config,
    unfinished_run,
    write_config,
    write_token_corpus,
)

pytestmark = pytest.mark.slow
RUN = "mixed"  # the snapshot name the training run is filed under
CRAWL, INGEST = "site", "books"
MIXTURE = (
    f"data.mixture=[{{corpus: {CRAWL}, snapshots: all, weight: 2}}, "
    f"{{corpus: {INGEST}, snapshots: '2026-11-01..2026-11-30', weight: 1}}]"
)
SETTINGS = (
    MIXTURE,
    "model.preset=tiny",
    "train.steps=6",
    "train.checkpoint_every=2",
    "train.seq_len=64",
    "train.eval_sequences=4",
    "evaluate.max_documents=4",
    "evaluate.lm_eval=false",
    "evaluate.max_new_tokens=4",
)


def ingested_snapshot(config, crawled_config, crawled: str, tokenizer: str, tmp_path) -> DatasetRef:
    """books/2026-11-01 through every corpus stage from a JSONL file of the crawl's cleaned pages."""
    import pyarrow.parquet as pq

    from pipeline.classify import job as classify_job
    from pipeline.clean import job as clean_job
    from pipeline.decontaminate import job as decontaminate_job
    from pipeline.dedup import job as dedup_job
    from pipeline.ingest import job as ingest_job
    from pipeline.tokenization import job as tokenize_job
    from tests.conftest import make_config

    pages = pq.read_table(
        DatasetRef.of(crawled_config, "clean", crawled).path / "documents", columns=["text"]
    )
    source = tmp_path / "books.jsonl"
    source.write_text(
        "".join(
            json.dumps({"id": f"book-{i}", "text": text}) + "\n"
            for i, text in enumerate(pages["text"].to_pylist())
        )
    )
    books = make_config(
        config.project.data_root,
        f"project.corpus={INGEST}",
        f"ingest.sources=[{source}]",
        "ingest.id_column=id",
        f"tokenize.tokenizer={CRAWL}/{tokenizer}",
    )
    ref = lambda stage: DatasetRef.of(books, stage, "2026-11-01")  # noqa: E731
    ingest_job.run(books, [], ref("ingest"))
    clean_job.run(books, [ref("ingest")], ref("clean"))
    dedup_job.run(books, [ref("clean")], ref("dedup"))
    classify_job.run(books, [ref("dedup")], ref("classify"))
    decontaminate_job.run(books, [ref("classify")], ref("decontaminate"))
    tokenize_job.run(books, [ref("decontaminate")], ref("tokenize"))
    return ref("tokenize")


@pytest.fixture
def five_snapshots(sample_corpus, tmp_path):
    """site/{fixture, 2026-11-02, 2026-11-03} and books/{2026-11-01 (ingested), 2026-11-02}, one tokenizer."""
    from pipeline.tokenization import store

    crawled_config, crawled = sample_corpus
    config = train_config(tmp_path / "data", *SETTINGS)
    real = DatasetRef.of(crawled_config, "tokenize", crawled)
    copy = DatasetRef(config.project.data_root, CRAWL, "tokenize", crawled)
    shutil.copytree(real.path, copy.path)  # the manifest still names its crawl's clean output upstream
    crawled_root, crawled_corpus = crawled_config.project.data_root, crawled_config.project.corpus
    tokenizer = store.default_name(crawled_root, crawled_corpus)
    assert tokenizer is not None  # the sample's tokenize stored its corpus's first tokenizer
    shutil.copytree(  # a stored tokenizer is files and a manifest, never changed: a copy is the same one
        store.tokenizer_ref(crawled_root, crawled_corpus, tokenizer).path,
        store.tokenizer_ref(config.project.data_root, CRAWL, tokenizer).path,
    )
    ingested = ingested_snapshot(config, crawled_config, crawled, tokenizer, tmp_path)
    assert store.manifest_digest(ingested.manifest()) == store.manifest_digest(real.manifest())
    made = [copy, ingested]
    for corpus, snapshot, seed in [
        (CRAWL, "2026-11-02", 2),
        (CRAWL, "2026-11-03", 3),
        (INGEST, "2026-11-02", 5),
    ]:
        made.append(
            write_token_corpus(config, snapshot, documents=40, seed=seed, corpus=corpus, tokenizer_from=real)
        )
    return config, made


def test_two_corpora_five_snapshots_trained_exported_and_every_input_listed(five_snapshots, tmp_path):
    from pipeline.evaluate.__main__ import main as evaluate_main
    from pipeline.export.__main__ import main as export_main
    from pipeline.report.__main__ import main as report_main

    config, inputs = five_snapshots
    digests = {(ref.corpus, ref.snapshot): ref.manifest().digest for ref in inputs}

    # The reference: one rank, uninterrupted, batch 8 (in another data root with the same inputs).
    reference_root = tmp_path / "reference"
    shutil.copytree(config.project.data_root, reference_root)
    reference = single_process(train_config(reference_root, *SETTINGS, "train.batch_size=8"), tmp_path)
    train(reference, RUN)

    # `pretrain train` on one rank of batch 8, stopped after step 3, then resumed on 2 ranks of batch 4.
    one_rank = write_config(
        train_config(config.project.data_root, *SETTINGS, "train.batch_size=8", "train.nproc_per_node=1"),
        tmp_path / "one.yaml",
    )
    stopped = start(pretrain_train(one_rank, RUN), env={**os.environ, ENV_FAULT: "SIGTERM@3:to=pretrain"})
    finish(stopped, expect_success=False, timeout_s=600)
    assert stopped.returncode == EXIT_STOPPED
    stopped_run = json.loads((unfinished_run(config, RUN) / "run.json").read_text())["run_id"]
    tracked = train_config(
        config.project.data_root, *SETTINGS, "tracking.stage_runs=true", "train.nproc_per_node=2"
    )
    path = write_config(tracked, tmp_path / "config.yaml")
    finish(start(pretrain_train(path, RUN, "train.batch_size=4")), timeout_s=600)

    trained = DatasetRef.of(config, "train", RUN)
    manifest = trained.manifest()
    assert manifest.extra["world_size"] == 2 and manifest.rows["steps"] == 6
    assert manifest.extra["run_id"] == stopped_run  # resumed, not started over
    assert losses(config, RUN) == pytest.approx(losses(reference, RUN), abs=1e-4)
    listed = [(entry["corpus"], entry["snapshot"]) for entry in manifest.extra["inputs"]]
    assert sorted(listed) == sorted(digests) and len(listed) == 5
    assert {(e["corpus"], e["snapshot"]): e["digest"] for e in manifest.extra["inputs"]} == digests
    record = json.loads((trained.path / "run.json").read_text())
    assert record["inputs"] == manifest.extra["inputs"]
    assert record["tokenizer_digest"] == manifest.extra["tokenizer_digest"]
    assert set(record["source_epochs"]) == {CRAWL, INGEST}

    for main in (export_main, evaluate_main, report_main):
        assert main(["--config", str(path), "--snapshot", RUN]) == 0

    card = (DatasetRef.of(config, "export", RUN).path / "README.md").read_text()
    for (corpus, snapshot), digest in digests.items():
        assert f"| {corpus} | {snapshot} | `{digest}` |" in card
    assert manifest.extra["tokenizer_digest"] in card

    evaluation = json.loads((DatasetRef.of(config, "evaluate", RUN).path / "metrics.json").read_text())
    assert set(evaluation["by_source"]) == {CRAWL, INGEST, "mixture"}

    report = DatasetRef.of(config, "report", RUN).manifest()
    client = MlflowClient(report.extra["tracking_uri"])
    run = client.get_run(report.extra["mlflow_run_id"])
    assert run.data.tags["pretrain.tokenizer_digest"] == manifest.extra["tokenizer_digest"]
    assert run.data.tags["pretrain.input_count"] == "5"
    assert {dataset.dataset.digest for dataset in run.inputs.dataset_inputs} >= set(digests.values())
    for name in (f"loss.{CRAWL}", f"loss.{INGEST}", f"val_loss.{INGEST}", f"epochs.{CRAWL}"):
        assert client.get_metric_history(run.info.run_id, name), name
    version = client.get_model_version(report.extra["registered_model"], report.extra["model_version"])
    assert version.tags["tokenizer_digest"] == manifest.extra["tokenizer_digest"]
    assert sorted(version.tags["inputs"].split(",")) == sorted(f"{c}/{s}" for c, s in digests)
    assert all(digest in version.description for digest in digests.values())
