"""The evaluate stage: held-out loss and perplexity of a training run's final model, overall, per source host
and per language, and greedy continuations of fixed prompts.

Each validation document (the first ``evaluate.max_documents`` of the split, in its seeded order) is scored
on its own: every token after its first, end-of-text included, predicted from the document's earlier tokens,
in windows of the model's context. The loss of a group is the token-weighted mean over its documents, so
the overall figure is not the trainer's ``val_loss`` (packed windows that cross documents) but close to it.
Hosts and languages come from the tokenize stage's ``<shard>.docs.parquet`` tables; shards written without
them are scored overall only, with a warning.

Where lm-evaluation-harness is installed (``evaluate.lm_eval``), it runs on the export stage's folder with a
multiple-choice task made from the same held-out documents (``pipeline.evaluate.harness``).

Output, ``evaluate/<snapshot>/<run>/``: ``metrics.json``, ``generations.json``, ``plots/loss_by_language.png``,
``plots/loss_by_host.png`` and ``lm_eval/`` (the task, its items and lm-eval's results); the report stage logs
them to the training's MLflow run.
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from pipeline.config import PipelineConfig
from pipeline.core.manifest import Manifest
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.data.sequences import IGNORE_INDEX, TokenStream
from pipeline.data.shards import DESCRIBED_SPLIT, DOCUMENTS_SUFFIX, shard_prefixes
from pipeline.model.inference import generations
from pipeline.model.trained import TrainedRun

log = logging.getLogger(__name__)
STAGE = "evaluate"
UNKNOWN = "unknown"


def document_labels(folder: Path, count: int) -> list[dict[str, str]] | None:
    """Each document's host and language, in stream order; None when a shard has no table (or counts differ)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for prefix in shard_prefixes(folder):
        path = prefix.with_name(prefix.name + DOCUMENTS_SUFFIX)
        if not path.is_file():
            log.warning("no %s for %s: the loss is reported overall only", DOCUMENTS_SUFFIX, prefix.name)
            return None
        tables.append(pq.read_table(path, columns=["domain", "lang"]))
    table = pa.concat_tables(tables)
    if table.num_rows != count:
        log.warning("document tables list %d documents, the shards %d: overall only", table.num_rows, count)
        return None
    columns = table.to_pydict()
    return [
        {"host": host or UNKNOWN, "language": language or UNKNOWN}
        for host, language in zip(columns["domain"], columns["lang"], strict=True)
    ]


def document_windows(tokens: np.ndarray, context: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(inputs, targets) windows predicting tokens[1:] from the document's earlier tokens; each window starts
    where the previous one's targets end, so every target is scored once (a long document's later windows
    lose the context before them, as any fixed-context model must)."""
    windows = []
    for start in range(0, len(tokens) - 1, context):
        piece = tokens[start : start + context + 1]
        windows.append((piece[:-1], piece[1:]))
    return windows


@torch.no_grad()
def document_losses(
    model, stream: TokenStream, documents: int, batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """(summed cross-entropy, scored tokens) per document, for the first ``documents`` of the stream."""
    context = model.config.max_position_embeddings
    owners, windows = [], []
    for index in range(documents):
        end = int(stream.document_ends[index])
        tokens = stream.read(end - int(stream.document_lengths[index]), end)
        for window in document_windows(tokens, context):
            owners.append(index)
            windows.append(window)
    loss_sums, counts = np.zeros(documents), np.zeros(documents, dtype=np.int64)
    for start in range(0, len(windows), batch_size):
        chunk = windows[start : start + batch_size]
        width = max(len(inputs) for inputs, _ in chunk)
        inputs = torch.zeros(len(chunk), width, dtype=torch.long)
        targets = torch.full((len(chunk), width), IGNORE_INDEX, dtype=torch.long)
        for row, (x, y) in enumerate(chunk):
            inputs[row, : len(x)], targets[row, : len(y)] = torch.from_numpy(x), torch.from_numpy(y)
        logits = model(inputs).logits.float()
        losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)
        scored = targets != IGNORE_INDEX
        for row, owner in enumerate(owners[start : start + len(chunk)]):
            loss_sums[owner] += float(losses[row][scored[row]].sum())
            counts[owner] += int(scored[row].sum())
    return loss_sums, counts


def grouped(loss_sums, counts, keys: list[str], top: int | None = None) -> dict[str, dict[str, Any]]:
    """Token-weighted loss and perplexity per key, largest groups first; past ``top``, one "other" group."""
    sums: defaultdict[str, float] = defaultdict(float)
    tokens: defaultdict[str, int] = defaultdict(int)
    docs: defaultdict[str, int] = defaultdict(int)
    for key, loss, count in zip(keys, loss_sums, counts, strict=True):
        sums[key] += loss
        tokens[key] += int(count)
        docs[key] += 1
    order = sorted(sums, key=lambda key: (-tokens[key], key))
    if top is not None and len(order) > top:
        for key in order[top:]:
            sums["other"] += sums.pop(key)
            tokens["other"] += tokens.pop(key)
            docs["other"] += docs.pop(key)
        order = [*order[:top], "other"]
    return {key: summary(sums[key], tokens[key], docs[key]) for key in order if tokens[key]}


def summary(loss_sum: float, tokens: int, documents: int) -> dict[str, Any]:
    loss = loss_sum / tokens if tokens else None
    return {
        "loss": loss,
        "perplexity": (math.exp(loss) if loss < 700 else math.inf) if loss is not None else None,
        "tokens": tokens,
        "documents": documents,
    }


def plot_groups(groups: dict[str, dict], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(groups)
    figure, axis = plt.subplots(figsize=(8, 0.4 * len(names) + 1.5))
    axis.barh(names[::-1], [groups[n]["loss"] for n in names[::-1]], color="tab:purple")
    for y, name in enumerate(names[::-1]):
        axis.annotate(
            f" {groups[name]['tokens']:,} tokens", (groups[name]["loss"], y), va="center", fontsize=8
        )
    axis.set(title=title, xlabel="held-out cross-entropy (nats/token)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def held_out_texts(trained: TrainedRun, stream: TokenStream, documents: int) -> list[str]:
    tokenizer = Tokenizer.from_file(str(trained.tokenizer_file))
    texts = []
    for index in range(documents):
        end = int(stream.document_ends[index])
        texts.append(
            tokenizer.decode(stream.read(end - int(stream.document_lengths[index]), end - 1).tolist())
        )
    return texts


def harness(trained, stream, export_folder: Path, folder: Path, settings) -> dict[str, Any] | None:
    """lm-evaluation-harness on the exported folder with the held-out continuation task (``harness``)."""
    from pipeline.evaluate.harness import continuation_items, run_harness, write_task

    documents = min(settings.lm_eval_documents, stream.num_documents)
    items = continuation_items(held_out_texts(trained, stream, documents), settings.lm_eval_choices)
    if not items:
        log.warning("too few held-out documents long enough for the lm-eval task: skipped")
        return None
    found = run_harness(export_folder, write_task(items, folder), settings.batch_size)
    if found is not None:
        log.info(
            "lm-eval %s: acc %.3f, acc_norm %.3f over %d items (chance %.3f)",
            found["task"],
            found["acc"],
            found["acc_norm"],
            found["items"],
            1 / settings.lm_eval_choices,
        )
        (folder / "results.json").write_text(json.dumps(found, indent=2) + "\n")
    return found


def source_losses(model, trained: TrainedRun, documents: int, batch_size: int) -> dict[str, dict[str, Any]]:
    """A training mixture's held-out loss per source (the first ``documents`` validation documents of its
    snapshots, in name order) and the mixture's (``mixture``: the sources' losses weighted as training drew
    them); empty for a run on one snapshot."""
    if not trained.manifest.extra.get("mixture"):
        return {}
    folders: dict[str, list[Path]] = defaultdict(list)
    weights: dict[str, float] = {}
    for entry in trained.inputs():
        folders[entry["source"]].append(Path(entry["path"]) / DESCRIBED_SPLIT)
        weights[entry["source"]] = float(entry["weight"])
    found: dict[str, dict[str, Any]] = {}
    for name, source_folders in folders.items():
        present = [folder for folder in source_folders if folder.is_dir()]
        if not present:
            log.warning("mixture source %s has no validation split: no held-out loss for it", name)
            continue
        stream = TokenStream(present)
        count = min(documents, stream.num_documents)
        loss_sums, counts = document_losses(model, stream, count, batch_size)
        found[name] = summary(float(loss_sums.sum()), int(counts.sum()), count)
        log.info("held-out loss of source %s: %s over %d documents", name, found[name]["loss"], count)
    scored = {name: group for name, group in found.items() if group["loss"] is not None}
    if scored:
        total = sum(weights[name] for name in scored)
        loss = sum(weights[name] * group["loss"] for name, group in scored.items()) / total
        found["mixture"] = {
            "loss": loss,
            "perplexity": math.exp(loss) if loss < 700 else math.inf,
            "tokens": sum(group["tokens"] for group in scored.values()),
            "documents": sum(group["documents"] for group in scored.values()),
        }
    return found


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    train_ref, export_ref = inputs
    export_ref.verify()  # the weights lm-evaluation-harness loads are the ones export wrote
    trained = TrainedRun.of(train_ref)
    settings = config.evaluate
    model = trained.model()
    folder = Path(trained.tokenize.path) / DESCRIBED_SPLIT
    with StageOutput(output, config, inputs) as out:
        metrics: dict[str, Any] = {"overall": None, "by_language": {}, "by_host": {}, "by_source": {}}
        try:
            stream = TokenStream(folder)
        except FileNotFoundError:
            log.warning("the tokenize output has no validation split: no held-out loss")
            stream = None
        if stream is not None:
            documents = min(settings.max_documents, stream.num_documents)
            log.info("scoring %d of %d validation documents", documents, stream.num_documents)
            loss_sums, counts = document_losses(model, stream, documents, settings.batch_size)
            metrics["overall"] = summary(float(loss_sums.sum()), int(counts.sum()), documents)
            labels = document_labels(folder, stream.num_documents)
            if labels is not None:
                labels = labels[:documents]
                metrics["by_language"] = grouped(loss_sums, counts, [x["language"] for x in labels])
                metrics["by_host"] = grouped(
                    loss_sums, counts, [x["host"] for x in labels], settings.top_hosts
                )
        metrics["by_source"] = source_losses(model, trained, settings.max_documents, settings.batch_size)
        (out.path / "plots").mkdir()
        for key, title in (
            ("by_language", "held-out loss by language"),
            ("by_host", "held-out loss by host"),
            ("by_source", "held-out loss by mixture source"),
        ):
            if metrics[key]:
                plot_groups(metrics[key], title, out.path / "plots" / f"loss_{key}.png")
        metrics["lm_eval"] = None
        if settings.lm_eval and stream is not None:
            found = harness(trained, stream, export_ref.path, out.path / "lm_eval", settings)
            if found is not None:
                metrics["lm_eval"] = {
                    key: found[key] for key in ("task", "version", "items", "choices", "acc", "acc_norm")
                }
        samples = generations(
            model,
            Tokenizer.from_file(str(trained.tokenizer_file)),
            settings.prompts,
            settings.max_new_tokens,
            trained.special_tokens().eos_id,
        )
        (out.path / "metrics.json").write_text(json.dumps(metrics, indent=2, ensure_ascii=False) + "\n")
        (out.path / "generations.json").write_text(json.dumps(samples, indent=2, ensure_ascii=False) + "\n")
        overall = metrics["overall"] or {}
        log.info(
            "held-out loss %s (perplexity %s) over %s tokens",
            overall.get("loss"),
            overall.get("perplexity"),
            overall.get("tokens"),
        )
        return out.commit(
            rows={"documents": overall.get("documents", 0), "prompts": len(samples)},
            counters={"tokens": overall.get("tokens", 0)},
            extra={
                "loss": overall.get("loss"),
                "perplexity": overall.get("perplexity"),
                "languages": len(metrics["by_language"]),
                "hosts": len(metrics["by_host"]),
                "loss_by_source": {name: group["loss"] for name, group in metrics["by_source"].items()}
                or None,
                "lm_eval_acc": (metrics["lm_eval"] or {}).get("acc"),
            },
        )
