"""The fixed held-out evaluation of an ablation: the reference text the user names (refused where it overlaps
any variant's training documents), encoded once with the shared tokenizer, and the base variant's validation
split; every checkpoint of every training is scored on the same documents (``pipeline.evaluate.job``), and
on the project's continuation task made from the reference (multiple choice, lm-eval's acc and acc_norm
computed with our own model: ``pipeline.evaluate.harness``)."""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.storage import DatasetRef, StageFailure

NGRAM = 13  # words per n-gram, as decontamination's default (and GPT-3's)
MIN_NGRAM = 8  # a shorter document is one n-gram of its own length down to this many words (decontaminate's)
CHOICES = 4  # continuation task: the true continuation among those of three other reference documents


class ReferenceOverlapError(StageFailure):
    """The held-out reference shares documents with a variant's training data."""


def read_reference(path: Path, limit: int) -> list[str]:
    """Documents of a JSONL file (a ``text`` field per line) or a text file (documents split by blank lines)."""
    if not path.is_file():
        raise FileNotFoundError(f"reference text {path} does not exist")
    texts: list[str] = []
    if path.suffix in (".jsonl", ".json"):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
                if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                    raise ValueError(f"{path}:{number}: each line needs a string field 'text'")
                texts.append(record["text"])
    else:
        texts = [part.strip() for part in re.split(r"\n\s*\n", path.read_text(encoding="utf-8"))]
    texts = [text for text in texts if text.strip()]
    if not texts:
        raise ValueError(f"reference text {path} holds no document")
    return texts[:limit]


@dataclass(frozen=True)
class Overlap:
    reference_index: int
    reference_start: str
    variant: str
    document_id: str
    document_url: str | None
    shared: int  # distinct n-grams of the reference document found in the training document
    of: int  # the reference document's n-grams
    example: str  # one shared n-gram, normalised


@dataclass
class ReferenceGrams:
    """The reference documents' word n-grams as decontamination makes them (``pipeline.decontaminate.ngrams``:
    its normalisation; ``NGRAM`` words, or one n-gram of its own length for a document of ``MIN_NGRAM`` to
    ``NGRAM - 1`` words), by width: the hashes, and where each comes from."""

    widths: dict[int, dict[int, list[tuple[int, int]]]]  # width -> hash -> [(reference, word position)]
    counts: list[int]  # n-grams per reference document (0: too short to check)
    words: list[list[str]]

    @classmethod
    def of(cls, references: list[str]) -> ReferenceGrams:
        from pipeline.decontaminate.ngrams import normalize_words, shingle

        normalized = normalize_words(references)
        words = [text.split(" ") if text else [] for text in normalized.to_pylist()]
        widths: dict[int, dict[int, list[tuple[int, int]]]] = {}
        counts = [0] * len(references)
        for width in sorted({min(NGRAM, len(w)) for w in words if len(w) >= MIN_NGRAM}):
            chosen = [i for i, w in enumerate(words) if len(w) >= MIN_NGRAM and min(NGRAM, len(w)) == width]
            grams = shingle([references[i] for i in chosen], width, normalized.take(chosen))
            table = widths.setdefault(width, {})
            for row, index in enumerate(chosen):
                hashes = grams.hashes[int(grams.offsets[row]) : int(grams.offsets[row + 1])]
                counts[index] = len(set(hashes.tolist()))
                for position, value in enumerate(hashes.tolist()):
                    table.setdefault(value, []).append((index, position))
        return cls(widths, counts, words)

    @property
    def unchecked(self) -> list[int]:
        """Reference documents too short to check (fewer than MIN_NGRAM words)."""
        return [index for index, count in enumerate(self.counts) if count == 0]


def shared_ngrams(grams: ReferenceGrams, texts: list[str]) -> dict[tuple[int, int], set[int]]:
    """(reference document, text) -> the n-gram hashes they share, for every pair sharing any."""
    from pipeline.decontaminate.ngrams import normalize_words, shingle

    normalized = normalize_words(texts)
    shared: defaultdict[tuple[int, int], set[int]] = defaultdict(set)
    for width, table in grams.widths.items():
        keys = np.fromiter(table, dtype=np.int64, count=len(table))
        shingled = shingle(texts, width, normalized)
        hits = np.flatnonzero(np.isin(shingled.hashes, keys))
        rows = np.searchsorted(shingled.offsets, hits, side="right") - 1
        for hit, row in zip(shingled.hashes[hits].tolist(), rows.tolist(), strict=True):
            for index, _ in table[hit]:
                shared[index, row].add(hit)
    return shared


def find_overlaps(references: list[str], documents: dict[str, list[DatasetRef]]) -> list[Overlap]:
    """Reference documents that share any word n-gram with a variant's training documents (decontamination's
    rule, ``ReferenceGrams``). ``documents``: variant -> the stage outputs whose ``documents/`` the variant's
    tokenize stage reads (one per source part)."""
    import pyarrow.dataset as ds

    grams = ReferenceGrams.of(references)
    found: list[Overlap] = []
    seen: set[tuple[int, str]] = set()
    for variant, ref in ((variant, ref) for variant, refs in documents.items() for ref in refs):
        dataset = ds.dataset(str(ref.path / "documents"), format="parquet")
        columns = [c for c in ("id", "url", "text") if c in dataset.schema.names]
        for batch in dataset.to_batches(columns=columns):
            rows = batch.to_pydict()
            texts = [text or "" for text in rows["text"]]
            for (index, row), hashes in sorted(shared_ngrams(grams, texts).items()):
                if (index, variant) in seen:
                    continue
                seen.add((index, variant))
                width = min(NGRAM, len(grams.words[index]))
                position = next(p for i, p in grams.widths[width][min(hashes)] if i == index)
                found.append(
                    Overlap(
                        index,
                        " ".join(references[index].split()[:8]),
                        variant,
                        str(rows["id"][row]),
                        rows.get("url", [None] * len(texts))[row],
                        len(hashes),
                        grams.counts[index],
                        " ".join(grams.words[index][position : position + width]),
                    )
                )
    return found


def refuse_overlaps(reference: Path, overlaps: list[Overlap]) -> None:
    if not overlaps:
        return
    shown = "; ".join(
        f"reference document {o.reference_index} ({o.reference_start!r}...) shares {o.shared} of its {o.of} "
        f"{NGRAM}-word n-grams (e.g. {o.example!r}) with variant {o.variant}'s training document "
        f"{o.document_id}" + (f" ({o.document_url})" if o.document_url else "")
        for o in overlaps[:5]
    )
    more = f" and {len(overlaps) - 5} more" if len(overlaps) > 5 else ""
    raise ReferenceOverlapError(
        f"the held-out reference {reference} overlaps the training data: {shown}{more}. A held-out set must "
        "share no text with what any variant trains on (the rule decontaminate applies): remove those documents "
        "from the reference, or decontaminate against it (decontaminate.sets) in every variant"
    )


def write_reference_shards(texts: list[str], tokenizer_file: Path, eos_token: str, folder: Path) -> Path:
    """The reference encoded as the tokenize stage encodes documents (end-of-text after each), one shard."""
    from tokenizers import Tokenizer

    from pipeline.data.shards import ShardWriter
    from pipeline.tokenization.encoder import DocumentEncoder

    encoder = DocumentEncoder.for_tokenizer(Tokenizer.from_file(str(tokenizer_file)), eos_token, 100_000)
    tokens, lengths = encoder.encode(texts)
    folder.mkdir(parents=True, exist_ok=True)
    with ShardWriter(folder / "reference_0", encoder.dtype) as writer:
        writer.add_documents(tokens, lengths)
    return folder


def write_continuation_task(texts: list[str], path: Path) -> int:
    """The project's continuation task (``pipeline.evaluate.harness``) made from the reference documents, one
    JSON item per line; returns how many (none when fewer usable documents than choices)."""
    from pipeline.evaluate.harness import continuation_items

    items = continuation_items(texts, CHOICES)
    path.write_text("".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items))
    return len(items)


def read_task(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@dataclass(frozen=True)
class EvalDocuments:
    """The documents of one eval set every checkpoint is scored on: the first ones of each folder (a mixture
    source's snapshots share the limit), with their scored tokens and their UTF-8 bytes (bits per byte)."""

    folders: tuple[Path, ...]
    per_folder: tuple[int, ...]  # documents scored from each folder, from its start
    tokens: tuple[int, ...]  # per document: tokens whose loss is summed (all but the first)
    bytes: tuple[int, ...]  # per document: its text's UTF-8 bytes (the end-of-text marker decodes to none)

    def to_dict(self) -> dict:
        return {
            "documents": len(self.tokens),
            "per_folder": list(self.per_folder),
            "tokens": list(self.tokens),
            "bytes": list(self.bytes),
        }


def eval_documents(folders: list[Path], max_documents: int, tokenizer_file: Path) -> EvalDocuments:
    from tokenizers import Tokenizer

    from pipeline.data.sequences import TokenStream

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    per_folder, tokens, sizes = [], [], []
    for folder in folders:
        stream = TokenStream(folder)
        documents = min(max(1, max_documents // len(folders)), stream.num_documents)
        per_folder.append(documents)
        for index in range(documents):
            end = int(stream.document_ends[index])
            ids = stream.read(end - int(stream.document_lengths[index]), end)
            tokens.append(max(0, len(ids) - 1))
            text = tokenizer.decode(ids.tolist(), skip_special_tokens=True)
            sizes.append(max(1, len(text.encode("utf-8"))))
    return EvalDocuments(tuple(folders), tuple(per_folder), tuple(tokens), tuple(sizes))


def checkpoint_scores(
    checkpoint: Path,
    eval_sets: dict[str, EvalDocuments],
    tasks: dict[str, list[dict]],
    tokenizer_file: Path,
    batch_size: int,
) -> tuple[dict, dict]:
    """One checkpoint's held-out loss on each eval set (the token-weighted mean over its documents, bits per
    byte beside it, and every document's summed nats for the paired test) and its accuracy on each
    multiple-choice task."""
    from tokenizers import Tokenizer

    from pipeline.data.sequences import TokenStream
    from pipeline.evaluate.harness import multiple_choice_accuracy
    from pipeline.evaluate.job import document_losses
    from pipeline.model.checkpoint import model_from_state, whole_model_checkpoint

    model = model_from_state(whole_model_checkpoint(checkpoint))
    losses = {}
    for name, documents in eval_sets.items():
        nats: list[float] = []
        for folder, count in zip(documents.folders, documents.per_folder, strict=True):
            sums, _ = document_losses(model, TokenStream(folder), count, batch_size)
            nats.extend(float(value) for value in sums)
        total, size = sum(documents.tokens), sum(documents.bytes)
        losses[name] = {
            "loss": sum(nats) / total if total else None,
            "bpb": sum(nats) / math.log(2) / size if size else None,
            "tokens": total,
            "document_nats": nats,
        }
    tokenizer = Tokenizer.from_file(str(tokenizer_file)) if tasks else None
    accuracy = {
        name: multiple_choice_accuracy(model, tokenizer, items) for name, items in tasks.items() if items
    }
    return losses, accuracy
