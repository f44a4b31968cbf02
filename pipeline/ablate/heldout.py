"""The fixed held-out evaluation of an ablation: the reference text the user names (refused where it overlaps
any variant's training documents), encoded once with the shared tokenizer, and the base variant's validation
split; every checkpoint of every training is scored on the same documents (``pipeline.evaluate.job``), and
on the project's continuation task made from the reference (multiple choice, lm-eval's acc and acc_norm
computed with our own model: ``pipeline.evaluate.harness``)."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.storage import DatasetRef, StageFailure

NGRAM = 13  # words per shingle, as decontamination's default (and GPT-3's)
OVERLAP_SHARE = 0.5  # a reference document with this share of its 13-grams in one training document is in it
CHOICES = 4  # continuation task: the true continuation among those of three other reference documents
_WORD = re.compile(r"\w+")


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


def shingles(text: str) -> set[int]:
    words = _WORD.findall(text.lower())
    if len(words) < NGRAM:
        return {hash(tuple(words))} if words else set()
    return {hash(tuple(words[i : i + NGRAM])) for i in range(len(words) - NGRAM + 1)}


@dataclass(frozen=True)
class Overlap:
    reference_index: int
    reference_start: str
    variant: str
    document_id: str
    document_url: str | None
    shared: int
    of: int


def find_overlaps(references: list[str], documents: dict[str, list[DatasetRef]]) -> list[Overlap]:
    """Reference documents that are (mostly) in a variant's documents: at least OVERLAP_SHARE of the reference
    document's word 13-grams appear in one training document. ``documents``: variant -> the stage outputs
    whose ``documents/`` the variant's tokenize stage reads (one per source part)."""
    import pyarrow.dataset as ds

    owners: defaultdict[int, list[int]] = defaultdict(list)
    sizes = []
    for index, text in enumerate(references):
        grams = shingles(text)
        sizes.append(len(grams))
        for gram in grams:
            owners[gram].append(index)
    found: list[Overlap] = []
    seen: set[tuple[int, str]] = set()
    for variant, ref in ((variant, ref) for variant, refs in documents.items() for ref in refs):
        dataset = ds.dataset(str(ref.path / "documents"), format="parquet")
        columns = [c for c in ("id", "url", "text") if c in dataset.schema.names]
        for batch in dataset.to_batches(columns=columns):
            rows = batch.to_pydict()
            for position, text in enumerate(rows["text"]):
                shared: defaultdict[int, int] = defaultdict(int)
                for gram in shingles(text or ""):
                    for index in owners.get(gram, ()):
                        shared[index] += 1
                for index, count in shared.items():
                    if (
                        sizes[index]
                        and count >= OVERLAP_SHARE * sizes[index]
                        and (index, variant) not in seen
                    ):
                        seen.add((index, variant))
                        found.append(
                            Overlap(
                                index,
                                " ".join(references[index].split()[:8]),
                                variant,
                                str(rows["id"][position]),
                                rows.get("url", [None] * len(rows["text"]))[position],
                                count,
                                sizes[index],
                            )
                        )
    return found


def refuse_overlaps(reference: Path, overlaps: list[Overlap]) -> None:
    if not overlaps:
        return
    shown = "; ".join(
        f"reference document {o.reference_index} ({o.reference_start!r}...) is in variant {o.variant}'s "
        f"training document {o.document_id}"
        + (f" ({o.document_url})" if o.document_url else "")
        + f": {o.shared} of its {o.of} {NGRAM}-grams"
        for o in overlaps[:5]
    )
    more = f" and {len(overlaps) - 5} more" if len(overlaps) > 5 else ""
    raise ReferenceOverlapError(
        f"the held-out reference {reference} overlaps the training data: {shown}{more}. A held-out set must "
        "hold documents no variant trains on: remove them from the reference, or decontaminate against it "
        "(decontaminate.sets) in every variant"
    )


def write_reference_shards(texts: list[str], tokenizer_file: Path, eos_token: str, folder: Path) -> Path:
    """The reference encoded as the tokenize stage encodes documents (end-of-text after each), one shard."""
    from tokenizers import Tokenizer

    from pipeline.tokenization.encoder import DocumentEncoder
    from pipeline.tokenization.shards import ShardWriter

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


def checkpoint_scores(
    checkpoint: Path,
    streams: dict[str, list[Path]],
    tasks: dict[str, list[dict]],
    tokenizer_file: Path,
    max_documents: int,
    batch_size: int,
) -> tuple[dict, dict]:
    """One checkpoint's held-out loss on each eval set (the token-weighted mean over its documents, read from
    its folders, up to ``max_documents`` in all) and its accuracy on each multiple-choice task."""
    from tokenizers import Tokenizer

    from pipeline.data.loader import TokenStream
    from pipeline.evaluate.harness import multiple_choice_accuracy
    from pipeline.evaluate.job import document_losses
    from pipeline.model.checkpoint import model_from_state, whole_model_checkpoint

    model = model_from_state(whole_model_checkpoint(checkpoint))
    losses = {}
    for name, folders in streams.items():
        loss_sum, total = 0.0, 0
        for folder in folders:
            stream = TokenStream(folder)
            documents = min(max(1, max_documents // len(folders)), stream.num_documents)
            sums, counts = document_losses(model, stream, documents, batch_size)
            loss_sum, total = loss_sum + float(np.sum(sums)), total + int(np.sum(counts))
        losses[name] = {"loss": loss_sum / total if total else None, "tokens": total}
    tokenizer = Tokenizer.from_file(str(tokenizer_file)) if tasks else None
    accuracy = {
        name: multiple_choice_accuracy(model, tokenizer, items) for name, items in tasks.items() if items
    }
    return losses, accuracy
