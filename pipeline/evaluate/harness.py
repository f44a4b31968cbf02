"""lm-evaluation-harness on the exported model, with a task made from this snapshot's held-out documents.

The task, ``pretrain_heldout_continuation``: each validation document is cut at a space near its middle; the
model sees up to ``CONTEXT_CHARS`` characters before the cut and picks the true next ``CONTINUATION_CHARS``
(to a word boundary) among that and the continuations of the next documents (multiple choice by
log-likelihood, lm-eval's ``acc`` and length-normalised ``acc_norm``; chance is 1 / choices). It is written
as a JSONL file and a task YAML beside it, read through ``datasets``' json builder: nothing comes from the hub.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
TASK = "pretrain_heldout_continuation"
CONTEXT_CHARS = 400
CONTINUATION_CHARS = 60

TASK_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""


def cut(text: str) -> tuple[str, str] | None:
    """(context, continuation) around a space near the middle of text; None if text is too short."""
    middle = text.find(" ", len(text) // 2)
    if middle <= 0:
        return None
    end = text.find(" ", middle + CONTINUATION_CHARS)
    continuation = text[middle : end if end > 0 else None]
    if len(continuation) < CONTINUATION_CHARS // 2:
        return None
    return text[max(0, middle - CONTEXT_CHARS) : middle], continuation


def continuation_items(texts: list[str], choices: int) -> list[dict[str, Any]]:
    """One multiple-choice item per usable text: its true continuation and those of the next texts (in a
    fixed rotation, so the label's position varies), deterministic."""
    pieces = [piece for piece in map(cut, texts) if piece is not None]
    if len(pieces) < choices:
        return []
    items = []
    for index, (context, truth) in enumerate(pieces):
        others = [pieces[(index + k) % len(pieces)][1] for k in range(1, choices)]
        label = index % choices
        options = [*others[:label], truth, *others[label:]]
        items.append({"context": context, "choices": options, "label": label})
    return items


def choice_loglikelihoods(model, tokenizer, context: str, choices: list[str]) -> list[float]:
    """Log-likelihood of each choice after the context, by lm-eval's rule for a causal model: trailing spaces
    of the context move to the choice, context and context + choice are encoded whole, the choice's tokens are
    what the whole adds, and the window is cut on the left to the model's context length."""
    import torch

    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, choices = context[:-spaces], [context[-spaces:] + choice for choice in choices]
    window = model.config.max_position_embeddings
    known = tokenizer.encode(context, add_special_tokens=False).ids
    rows = []
    for choice in choices:
        whole = tokenizer.encode(context + choice, add_special_tokens=False).ids
        added = whole[len(known) :]
        rows.append(((known + added)[-(window + 1) :], len(added)))
    width = max(len(tokens) for tokens, _ in rows) - 1
    inputs = torch.zeros(len(rows), width, dtype=torch.long)
    for row, (tokens, _) in enumerate(rows):
        inputs[row, : len(tokens) - 1] = torch.tensor(tokens[:-1])
    with torch.no_grad():  # right padding: a causal model's earlier positions never see it
        logprobs = torch.log_softmax(model(inputs).logits.double(), -1)
    found = []
    for row, (tokens, count) in enumerate(rows):
        end = len(tokens) - 1
        targets = torch.tensor(tokens[-count:])
        found.append(float(logprobs[row, end - count : end].gather(1, targets[:, None]).sum()))
    return found


def multiple_choice_accuracy(model, tokenizer, items: list[dict[str, Any]]) -> dict[str, Any]:
    """lm-eval's ``acc`` (the likeliest choice is the label) and ``acc_norm`` (likelihood per character of
    the choice) over the items, scored with our own model: no export, no harness. An item is ``context``,
    ``choices``, ``label`` (the true choice's index) and optionally ``delimiter`` (put before each choice)."""
    correct = normalised = 0
    for item in items:
        delimiter = item.get("delimiter", "")  # lm-eval's target_delimiter: scored, not counted in acc_norm
        choices = [delimiter + choice for choice in item["choices"]]
        likelihoods = choice_loglikelihoods(model, tokenizer, item["context"], choices)
        per_char = [ll / max(1, len(choice)) for ll, choice in zip(likelihoods, item["choices"], strict=True)]
        correct += int(max(range(len(likelihoods)), key=likelihoods.__getitem__) == item["label"])
        normalised += int(max(range(len(per_char)), key=per_char.__getitem__) == item["label"])
    count = len(items)
    return {
        "items": count,
        "choices": len(items[0]["choices"]) if items else 0,
        "acc": correct / count if count else None,
        "acc_norm": normalised / count if count else None,
    }


class LocalTaskError(ValueError):
    """An lm-eval task that cannot be scored here; the message names it and what to do."""


def local_task_items(name: str, include_path: Path | None = None, limit: int | None = None) -> list[dict]:
    """The items of an lm-eval multiple-choice task present on this machine (a task YAML under
    ``include_path``, or a registered task whose dataset is in the local Hugging Face cache), zero-shot, as
    lm-eval builds its requests: the context (description and ``doc_to_text``), each choice after the task's
    target delimiter, the gold choice's index. Nothing is downloaded: a task whose data is not here is refused."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # read when the hub libraries load: before lm-eval
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        from lm_eval.tasks import TaskManager, get_task_dict
    except ImportError:
        raise LocalTaskError(
            f"task {name}: lm-evaluation-harness is not installed (pip install lm_eval)"
        ) from None
    manager = TaskManager(include_path=str(include_path) if include_path else None)
    if name not in manager.all_tasks:
        where = f" or under {include_path}" if include_path else ""
        raise LocalTaskError(f"task {name}: lm-eval knows no task of that name{where}")
    if name in manager.all_groups:
        raise LocalTaskError(f"task {name} is a group of lm-eval tasks: name its tasks one by one")
    try:
        task = get_task_dict([name], manager)[name]
        docs = list(task.eval_docs)
    except Exception as exc:  # datasets raises many kinds when offline and the data is not cached
        raise LocalTaskError(
            f"task {name}: its data is not on this machine ({type(exc).__name__}: {exc}); download it once "
            '(python -c "import datasets; datasets.load_dataset(...)") or leave the task out'
        ) from None
    if task.OUTPUT_TYPE != "multiple_choice" or task.multiple_input:
        raise LocalTaskError(
            f"task {name} is {task.OUTPUT_TYPE}{' with several inputs' if task.multiple_input else ''}: only "
            "multiple-choice tasks with one context are scored here"
        )
    items = []
    for doc in docs[:limit]:
        choices = [str(choice) for choice in task.doc_to_choice(doc)]
        gold = task.doc_to_target(doc)
        label = choices.index(gold) if isinstance(gold, str) and gold in choices else gold
        if not isinstance(label, int) or not 0 <= label < len(choices):
            continue  # lm-eval scores it as wrong for every model; it would only add noise
        items.append(
            {
                "context": task.fewshot_context(doc, 0),
                "choices": choices,
                "label": label,
                "delimiter": task.config.target_delimiter,
            }
        )
    return items


def write_task(items: list[dict[str, Any]], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{TASK}.jsonl"
    data.write_text("".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items))
    (folder / f"{TASK}.yaml").write_text(TASK_YAML.format(task=TASK, data=json.dumps(str(data))))
    return folder


def run_harness(model_folder: Path, task_folder: Path, batch_size: int) -> dict[str, Any] | None:
    """lm-eval's figures for the task on the exported folder; None when lm-eval is not installed."""
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        log.warning("lm-evaluation-harness is not installed (pip install 'lm_eval[hf]'): skipped")
        return None
    from unittest import mock

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    # lm-eval records `git describe` of the working directory as its own commit: not lm-eval's, and outside a
    # checkout git prints "fatal: not a git repository" into the stage's log. Our manifest names our code.
    with mock.patch("lm_eval.evaluator.get_git_commit_hash", return_value=None):
        results = lm_eval.simple_evaluate(
            model="hf",
            model_args=f"pretrained={model_folder},dtype=float32",
            tasks=[TASK],
            task_manager=TaskManager(include_path=str(task_folder)),
            batch_size=batch_size,
            device="cpu",
        )
    figures = results["results"][TASK]
    return {
        "task": TASK,
        "version": lm_eval.__version__,
        "items": int(figures.get("sample_len") or len(results["samples"][TASK])),
        "choices": len(results["samples"][TASK][0]["doc"]["choices"]) if results["samples"][TASK] else 0,
        "acc": figures["acc,none"],
        "acc_norm": figures["acc_norm,none"],
        "predictions": [
            {"label": sample["target"], "loglikelihoods": [float(r[0]) for r in sample["filtered_resps"]]}
            for sample in results["samples"][TASK]
        ],
    }
