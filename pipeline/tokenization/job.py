"""The tokenize stage: pick the tokenizer (the corpus's shared one by default), then encode every document in Spark.

Output layout (format: ``docs/token-shards.md``)::

    tokenizer.json, tokenizer_config.json    HF tokenizers / transformers files: the tokenizer used, copied
    train/shard-PPPPP-NNNN.bin, .idx         Megatron MMIDIDX shards, documents in seeded shuffled order
    validation/shard-PPPPP-NNNN.bin, .idx    (PPPPP: writer task, NNNN: roll-over file inside the task)
    validation/shard-PPPPP-NNNN.docs.parquet  each validation document's id, host and language, in shard order
    excluded/part-00000.parquet              documents that were not tokenized (id, text, reason)

Steps: documents with no text are set aside (reason ``empty``); each remaining document goes to train or
validation by a seeded hash of its id, and gets a seeded hash ``order``. The tokenizer is ``tokenize.tokenizer``'s
(``pipeline.tokenization.store``): the corpus's default, a stored one by name, or a BPE of this snapshot's own;
a BPE trained here (the corpus's first default, or ``snapshot``) learns from the train documents with the
smallest ``order`` (a uniform sample). The manifest's ``extra.tokenizer`` names it and its digest. One Spark job then hash-partitions by ``order``, sorts each
partition by (split, order, id) and encodes it with ``mapInArrow``: a Python worker loads the tokenizer once,
encodes each Arrow batch with ``encode_batch_fast`` and appends the shards it writes, rolling over to a new
file at ``tokenize.max_tokens_per_shard``. The output depends only on the input rows and the config.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pyarrow as pa

from pipeline.config import PipelineConfig
from pipeline.core.manifest import Manifest
from pipeline.core.progress import StepClock
from pipeline.core.spark import aggregate, map_in_arrow, spark_schema, spark_session, write_parquet
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.data.shards import DESCRIBED_SPLIT, DOCUMENTS_SUFFIX, RollingShardWriter, token_dtype
from pipeline.data.tokenizer_files import folder_digest
from pipeline.tokenization.bpe import TOKENIZER_FILE, load_tokenizer, save_tokenizer, train_tokenizer
from pipeline.tokenization.encoder import DocumentEncoder, EncodeCounters, configure_threads, texts_from_arrow
from pipeline.tokenization.store import (
    DEFAULT_CHOICE,
    SNAPSHOT_CHOICE,
    ensure_default,
    resolve_reference,
    special_token_facts,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
STAGE = "tokenize"
SPLITS = ("train", "validation")
BUCKETS = 1_000_000
# Characters str.isspace() accepts; a document made only of these has nothing to tokenize.
WHITESPACE = "".join(c for c in map(chr, range(0x110000)) if c.isspace())
ESTIMATE_SAMPLE_CHARS = 2_000_000
ESTIMATE_DOCUMENTS, ESTIMATE_DOCUMENT_CHARS = 2000, 1000  # the sample that sizes the encoding job

# One row per shard file written (kind "file") and one per task and split with its counters (kind "counts").
RESULT_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("split", pa.string()),
        ("shard", pa.string()),
        ("documents", pa.int64()),
        ("tokens", pa.int64()),
        ("bin_bytes", pa.int64()),
        ("bin_sha256", pa.string()),
        ("idx_sha256", pa.string()),
        ("oversized_documents", pa.int64()),
        ("repaired_unicode", pa.int64()),
        ("chunked_documents", pa.int64()),
    ]
)

# What the manifest lists for each shard file.
SHARD_FIELDS = (
    "split",
    "shard",
    "documents",
    "tokens",
    "bin_bytes",
    "bin_sha256",
    "idx_sha256",
    "oversized_documents",
)


@functools.lru_cache(maxsize=4)
def _cached_encoder(
    tokenizer_path: str, eos_token: str, chunk_chars: int, pad_token: str | None
) -> DocumentEncoder:
    """Loaded once per Python worker (workers are reused across tasks), not once per batch."""
    from tokenizers import Tokenizer

    return DocumentEncoder.for_tokenizer(
        Tokenizer.from_file(tokenizer_path), eos_token, chunk_chars, pad_token
    )


def _split_runs(splits: list[str]) -> Iterator[tuple[str, int, int]]:
    """(split, start, stop) for each run of equal values; rows arrive sorted by split."""
    start = 0
    for i in range(1, len(splits) + 1):
        if i == len(splits) or splits[i] != splits[start]:
            yield splits[start], start, i
            start = i


DOCUMENT_COLUMNS = ("id", "domain", "lang")


def write_document_tables(folder: Path, shards, described: list[pa.RecordBatch], temp_suffix: str) -> None:
    """One ``<shard>.docs.parquet`` per shard: its documents' DOCUMENT_COLUMNS in the shard's order."""
    import pyarrow.parquet as pq

    if not shards:
        return
    table = pa.Table.from_batches(described)
    start = 0
    for shard in shards:
        part = table.slice(start, shard.documents)
        start += shard.documents
        final = folder / f"{shard.name}{DOCUMENTS_SUFFIX}"
        temporary = final.with_name(final.name + temp_suffix)
        pq.write_table(part, temporary)
        os.replace(temporary, final)


def encode_partition(
    batches: Iterator[pa.RecordBatch],
    *,
    tokenizer_path: str,
    output: str,
    eos_token: str,
    pad_token: str | None,
    chunk_chars: int,
    max_tokens_per_shard: int,
    threads: int,
) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    configure_threads(threads)
    encoder = _cached_encoder(tokenizer_path, eos_token, chunk_chars, pad_token)
    context = TaskContext.get()
    assert context is not None  # a mapInArrow body runs inside a Spark task
    stem = f"shard-{context.partitionId():05d}"
    temp_suffix = f".tmp-{context.taskAttemptId()}"
    writers: dict[str, RollingShardWriter] = {}
    counters: dict[str, EncodeCounters] = {}
    described: list[pa.RecordBatch] = []  # the validation documents' DOCUMENT_COLUMNS, in writing order
    try:
        for batch in batches:
            text_column = batch.column("text")
            for split, start, stop in _split_runs(batch.column("split").to_pylist()):
                if split == DESCRIBED_SPLIT:
                    described.append(batch.select(list(DOCUMENT_COLUMNS)).slice(start, stop - start))
                texts, repaired = texts_from_arrow(text_column.slice(start, stop - start))
                encoder.counters = counters.setdefault(split, EncodeCounters())
                encoder.counters.repaired_unicode += repaired
                tokens, lengths = encoder.encode(
                    cast(list[str], texts)
                )  # only documents with text reach here
                if split not in writers:
                    writers[split] = RollingShardWriter(
                        Path(output) / split, stem, encoder.dtype, max_tokens_per_shard, temp_suffix
                    )
                writers[split].add_documents(tokens, lengths)
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    rows = []
    for split, writer in writers.items():
        shards = writer.close()
        if split == DESCRIBED_SPLIT:
            write_document_tables(Path(output) / split, shards, described, temp_suffix)
        for shard in shards:
            rows.append(
                {
                    "kind": "file",
                    "split": split,
                    "shard": f"{split}/{shard.name}",
                    "documents": shard.documents,
                    "tokens": shard.tokens,
                    "bin_bytes": shard.bin_bytes,
                    "bin_sha256": shard.bin_sha256,
                    "idx_sha256": shard.idx_sha256,
                    "oversized_documents": shard.oversized_documents,
                }
            )
        rows.append(
            {
                "kind": "counts",
                "split": split,
                "documents": counters[split].documents,
                "repaired_unicode": counters[split].repaired_unicode,
                "chunked_documents": counters[split].chunked_documents,
            }
        )
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=RESULT_SCHEMA)


def validation_threshold(fraction: float, documents: int, under_threshold: int, smallest_bucket) -> int:
    """Bucket bound for the validation split; a corpus of two or more documents gives it at least one, and a
    single document always goes to train."""
    if documents < 2:
        return 0
    threshold = int(fraction * BUCKETS)
    if fraction > 0 and under_threshold == 0 and smallest_bucket is not None:
        threshold = smallest_bucket + 1
    return threshold


def estimate_chars_per_token(tokenizer, texts: list[str]) -> float:
    """Characters per token on (a prefix of) ``texts``, to size the Spark job."""
    budget, chosen = ESTIMATE_SAMPLE_CHARS, []
    for text in texts:
        if budget <= 0:
            break
        chosen.append(text[:budget])
        budget -= len(chosen[-1])
    tokens = sum(len(encoding.ids) for encoding in tokenizer.encode_batch_fast(chosen))
    # Below 1 is real (Chinese measured 0.99: a byte-level BPE may spend more than one token on a character).
    return sum(map(len, chosen)) / tokens if tokens else 1.0


@dataclass(frozen=True)
class DocumentCounts:
    documents: int  # with text: these are tokenized
    empty: int  # no text at all, or whitespace only: set aside with reason "empty"
    characters: int  # in the documents with text, to size the encoding job


def _kept():
    """Documents with text (the ``empty`` column is never null)."""
    from pyspark.sql import functions as F

    return F.col("empty") == F.lit(False)


def split_documents(
    spark, documents_ref: DatasetRef, config: PipelineConfig
) -> tuple[DataFrame, DocumentCounts]:
    """The documents with ``empty``, ``split`` (by a seeded hash bucket of the id) and ``order`` (a seeded hash)
    columns, and their counts, from one Spark aggregation."""
    from pyspark.sql import functions as F

    seed, settings = config.project.seed, config.tokenize
    docs = spark.read.parquet(str(documents_ref.path / "documents"))
    # Host and language travel with the validation documents (DOCUMENT_COLUMNS); null where a source has none.
    docs = docs.select(
        "id",
        "text",
        *(F.col(c) if c in docs.columns else F.lit(None).cast("string").alias(c) for c in ("domain", "lang")),
    )
    docs = docs.withColumns(
        {
            "empty": F.col("text").isNull() | (F.length(F.btrim("text", F.lit(WHITESPACE))) == 0),
            "bucket": F.pmod(F.xxhash64(F.lit(seed), "id"), F.lit(BUCKETS)),
        }
    )
    kept = _kept()
    first_threshold = int(settings.validation_fraction * BUCKETS)
    summary = aggregate(
        docs,
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.when(kept, 1).otherwise(0)).alias("documents"),
        F.sum(F.when(kept & (F.col("bucket") < first_threshold), 1).otherwise(0)).alias("under"),
        F.min(F.when(kept, F.col("bucket"))).alias("smallest"),
        F.sum(F.when(kept, F.length("text")).otherwise(0)).alias("chars"),
    )
    documents, empty = int(summary["documents"] or 0), int(summary["rows"] - (summary["documents"] or 0))
    threshold = validation_threshold(
        settings.validation_fraction, documents, int(summary["under"] or 0), summary["smallest"]
    )
    docs = docs.withColumns(
        {
            "split": F.when(F.col("bucket") < threshold, "validation").otherwise("train"),
            "order": F.xxhash64(F.lit(seed + 1), "id"),
        }
    )
    if documents == 0:
        raise ValueError(f"{documents_ref.path}: no document with text to tokenize ({empty} empty)")
    return docs, DocumentCounts(documents, empty, int(summary["chars"] or 0))


def sample_texts(docs: DataFrame, documents: int, chars: int) -> list[str]:
    """The first ``chars`` characters of the ``documents`` train documents with the smallest ``order``: a
    uniform sample, the same on every run."""
    from pyspark.sql import functions as F

    return [
        row.text
        for row in docs.where(_kept() & (F.col("split") == "train"))
        .orderBy("order", "id")
        .limit(documents)
        .select(F.substring("text", 1, chars).alias("text"))
        .collect()
    ]


def bpe_writer(sample_of: Callable[[], list[str]], config: PipelineConfig) -> Callable[[Path], dict]:
    """What stores a BPE trained on ``sample_of()`` (called only then) into a folder, returning its facts."""

    def write(folder: Path) -> dict:
        sample = sample_of()
        tokenizer = train_tokenizer(sample, config.bpe)
        save_tokenizer(tokenizer, folder, config.bpe)
        log.info(
            "trained a byte-level BPE with %d tokens on %d documents", tokenizer.get_vocab_size(), len(sample)
        )
        settings = config.bpe
        return {
            "kind": "trained",
            "eos_token": settings.eos_token,
            "pad_token": settings.pad_token,
            "split_cjk": settings.split_cjk,
            "sample_documents": len(sample),
            "settings": settings.model_dump(mode="json"),
        }

    return write


@dataclass(frozen=True)
class ChosenTokenizer:
    facts: dict  # vocab_size, eos/pad tokens and ids, split_cjk, ...
    described: dict  # name, corpus, digest, kind, path: what the manifest records as "tokenizer"


def snapshot_sample(docs: DataFrame, config: PipelineConfig) -> Callable[[], list[str]]:
    """The BPE's training sample from this snapshot: ``bpe.sample_docs`` documents."""
    return lambda: sample_texts(docs, config.bpe.sample_docs, config.tokenize.chunk_chars)


def choose_tokenizer(
    docs: DataFrame, config: PipelineConfig, documents_ref: DatasetRef, output: DatasetRef, folder: Path
) -> ChosenTokenizer:
    """The tokenizer ``tokenize.tokenizer`` names, its two files copied into ``folder`` (the tokenize output):
    the corpus's default (stored from this snapshot's sample when the corpus has none), a stored one by name,
    or (``snapshot``) a BPE of this snapshot's own."""
    choice = config.tokenize.tokenizer
    if choice == SNAPSHOT_CHOICE:
        facts = bpe_writer(snapshot_sample(docs, config), config)(folder)
        facts |= special_token_facts(folder, facts["eos_token"], facts["pad_token"])
        described = {
            "name": None,
            "corpus": output.corpus,
            "digest": folder_digest(folder),
            "kind": "snapshot",
        }
        return ChosenTokenizer(facts, described | {"path": str(output.path)})
    if choice == DEFAULT_CHOICE:
        stored = ensure_default(
            config,
            output.corpus,
            f"bpe-{output.snapshot}",
            bpe_writer(snapshot_sample(docs, config), config),
            [documents_ref],
        )
        current = config.bpe.model_dump(mode="json")
        trained_with = stored.facts.get("settings") or current  # an imported default has no BPE settings
        changed = sorted(key for key, value in trained_with.items() if current.get(key) != value)
        if changed:
            log.warning(
                "bpe.%s differ from the settings corpus %s's default tokenizer %s was trained with; "
                "it is used anyway, so every snapshot shares its ids (set tokenize.tokenizer=snapshot for a "
                "BPE of this snapshot's own, or store another with `pretrain tokenizer train`)",
                ", bpe.".join(changed),
                stored.corpus,
                stored.name,
            )
    else:
        stored = resolve_reference(config, choice)
    stored.copy_into(folder)
    log.info("tokenizing with %s/%s (digest %s)", stored.corpus, stored.name, stored.digest)
    return ChosenTokenizer(dict(stored.facts), stored.describe())


def encode_documents(
    spark: SparkSession,
    docs: DataFrame,
    config: PipelineConfig,
    folder: Path,
    estimated_tokens: float,
    eos_token: str,
    pad_token: str | None,
) -> tuple[list[dict], int]:
    """(result rows, tasks): every document with text encoded into ``folder/<split>/`` shards by one Spark job
    of at least ``tokenize.num_shards`` tasks, each writing about ``max_tokens_per_shard`` tokens or fewer."""
    settings = config.tokenize
    partitions = max(settings.num_shards, math.ceil(estimated_tokens / settings.max_tokens_per_shard))
    threads = settings.threads_per_task or int(spark.conf.get("spark.task.cpus", "1") or 1)
    for split in SPLITS:
        (folder / split).mkdir()
    encode = functools.partial(
        encode_partition,
        tokenizer_path=str(folder / TOKENIZER_FILE),
        output=str(folder),
        eos_token=eos_token,
        pad_token=pad_token,
        chunk_chars=settings.chunk_chars,
        max_tokens_per_shard=settings.max_tokens_per_shard,
        threads=threads,
    )
    log.info(
        "encoding ~%.3g tokens in %d tasks with %d thread(s) each", estimated_tokens, partitions, threads
    )
    ordered = (
        docs.where(_kept())
        .repartition(partitions, "order")
        .sortWithinPartitions("split", "order", "id", "text")
        .select("split", "text", *DOCUMENT_COLUMNS)
    )
    results = [row.asDict() for row in map_in_arrow(ordered, encode, spark_schema(RESULT_SCHEMA)).collect()]
    return results, partitions


def write_excluded(docs: DataFrame, folder: Path) -> None:
    """The documents set aside, with their reason, into ``folder/excluded``; then the leftovers of task
    attempts that failed and were retried are removed."""
    from pyspark.sql import functions as F

    write_parquet(
        docs.where(~_kept()).select("id", "text", F.lit("empty").alias("reason")),
        folder / "excluded",
        num_files=1,
    )
    for leftover in folder.rglob("*.tmp-*"):
        leftover.unlink()


def shard_totals(results: list[dict], documents: int) -> tuple[list[dict], list[dict], dict[str, dict]]:
    """(file rows sorted by shard, count rows, per-split totals); raises if a document is missing from them."""
    files = sorted((r for r in results if r["kind"] == "file"), key=lambda r: r["shard"])
    counts = [r for r in results if r["kind"] == "counts"]
    totals = {
        split: {
            "documents": sum(r["documents"] for r in files if r["split"] == split),
            "tokens": sum(r["tokens"] for r in files if r["split"] == split),
            "shards": sum(1 for r in files if r["split"] == split),
        }
        for split in SPLITS
    }
    if sum(t["documents"] for t in totals.values()) != documents:
        raise RuntimeError(
            f"wrote {sum(t['documents'] for t in totals.values())} documents to shards, expected {documents}"
        )
    return files, counts, totals


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    (documents_ref,) = inputs
    clock = StepClock("tokenize", log)
    lap = clock.done

    with StageOutput(output, config, inputs) as out:
        spark = spark_session(config, f"tokenize-{output.corpus}-{output.snapshot}")
        docs, counts = split_documents(spark, documents_ref, config)
        lap("read_and_count")
        chosen = choose_tokenizer(docs, config, documents_ref, output, out.path)
        facts = chosen.facts
        lap("train_tokenizer")
        # Sizes the encoding job (so the shard files): measured on a sample that depends only on the
        # snapshot and the tokenizer, never on whether this run trained it or found it stored.
        estimate_sample = sample_texts(docs, ESTIMATE_DOCUMENTS, ESTIMATE_DOCUMENT_CHARS)
        chars_per_token = estimate_chars_per_token(load_tokenizer(out.path), estimate_sample)
        results, partitions = encode_documents(
            spark,
            docs,
            config,
            out.path,
            counts.characters / chars_per_token,
            facts["eos_token"],
            facts.get("pad_token"),
        )
        lap("encode")
        write_excluded(docs, out.path)
        lap("excluded")

        files, task_counts, totals = shard_totals(results, counts.documents)
        log.info("tokenized %s", totals)
        return out.commit(
            rows={
                **{f"{split}_documents": totals[split]["documents"] for split in SPLITS},
                "excluded": counts.empty,
            },
            counters={
                "tokens": {split: totals[split]["tokens"] for split in SPLITS},
                "shards": {split: totals[split]["shards"] for split in SPLITS},
                "dropped": {"empty": counts.empty},
                "repaired_unicode": sum(r["repaired_unicode"] for r in task_counts),
                "chunked_documents": sum(r["chunked_documents"] for r in task_counts),
                "oversized_documents": sum(r["oversized_documents"] for r in files),
            },
            extra={
                "vocab_size": facts["vocab_size"],
                "dtype": token_dtype(facts["vocab_size"]).name,
                "eos_token": facts["eos_token"],
                "eos_id": facts["eos_id"],
                "pad_token": facts["pad_token"],
                "pad_id": facts["pad_id"],
                "split_cjk": facts.get("split_cjk"),
                "tokenizer": chosen.described,
                "chars_per_token": round(chars_per_token, 4),
                "tasks": partitions,
                "seconds": clock.seconds,
                "shards": [{key: r[key] for key in SHARD_FIELDS} for r in files],
            },
        )
