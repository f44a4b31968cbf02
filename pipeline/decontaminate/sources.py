"""Evaluation items, one text each, from the sets the config names.

* ``heldout``: this corpus's own held-out material from other snapshots: the tokenize stage's validation
  documents (ids in ``validation/*.docs.parquet``, texts from the documents that tokenize read) and the
  evaluate stage's lm-eval task items (``lm_eval/*.jsonl``: context plus the right continuation);
* ``lm_eval``: lm-evaluation-harness tasks whose data is present locally (its TaskManager, offline): each
  item is the task's prompt (``doc_to_text``) plus its gold answer; a task that is not present is skipped and
  listed in the manifest;
* ``file``: JSONL, Parquet or .txt files, ``fields`` joined by a space.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.manifest import MANIFEST_NAME
from pipeline.core.snapshots import base_snapshot, is_variant, snapshot_folders
from pipeline.core.storage import LATEST, DatasetRef, local_path
from pipeline.decontaminate.config import EvalSet
from pipeline.documents.sources import source_files

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipeline.config import PipelineConfig

log = logging.getLogger(__name__)
VALIDATION = "validation"


def heldout_snapshots(
    config: PipelineConfig, stage: str, current: str, chosen: list[str] | None
) -> list[str]:
    """The snapshots whose held-out material ``current`` is checked against: ``chosen``, or by default every
    snapshot of ``stage`` that sorts before ``current`` (before the snapshot it derives from, for an ablation
    variant). Later snapshots are left out, so a rerun reads what the first run read, whatever ran since."""
    if chosen is not None:
        return [name for name in chosen if name != current]
    base = base_snapshot(current)
    return [
        name
        for name in snapshot_folders(config.project.data_root, config.project.corpus, stage)
        if name < base and not is_variant(name)
    ]


def heldout_items(
    spark: SparkSession, config: PipelineConfig, eval_set: EvalSet, current: str
) -> tuple[DataFrame | None, list[str], dict]:
    """Validation documents and evaluation-task items of the other snapshots: (items, texts from the driver,
    what was found)."""

    frames = []
    found: dict[str, Any] = {"validation_snapshots": [], "task_files": []}
    for snapshot in heldout_snapshots(config, "tokenize", current, eval_set.snapshots):
        ref = DatasetRef.of(config, "tokenize", snapshot)
        if not ref.is_complete():
            log.warning(
                "decontaminate: tokenize %s is not complete (still running?); its validation set is skipped, "
                "and a rerun once it finishes will read it (backfill dates in order: docs/airflow.md, Backfill)",
                snapshot,
            )
            continue
        tables = sorted((ref.path / VALIDATION).glob("*.docs.parquet"))
        if not tables:
            continue
        source = Path(ref.manifest().inputs[0]["path"]) / "documents" if ref.manifest().inputs else None
        if source is None or not source.is_dir():
            log.warning(
                "decontaminate: tokenize %s names no readable input documents; its validation set is skipped",
                snapshot,
            )
            continue
        ids = spark.read.parquet(*map(str, tables)).select("id").distinct()
        frames.append(spark.read.parquet(str(source)).join(ids, "id", "left_semi").select("text"))
        found["validation_snapshots"].append(snapshot)
    texts: list[str] = []
    for snapshot in heldout_snapshots(config, "evaluate", current, eval_set.snapshots):
        for task_file in sorted(
            (local_path(config.project.data_root) / config.project.corpus / "evaluate" / snapshot).glob(
                "*/lm_eval/*.jsonl"
            )
        ):
            run = task_file.parent.parent
            if run.name == LATEST or run.is_symlink() or not (run / MANIFEST_NAME).is_file():
                continue  # `latest` points at a run listed anyway; a run without a manifest is being written
            for line in task_file.read_text(encoding="utf-8").splitlines():
                item = json.loads(line)
                if "context" in item and "choices" in item and "label" in item:
                    texts.append(f"{item['context']} {item['choices'][int(item['label'])]}")
            found["task_files"].append(str(task_file))
    items = None
    for frame in frames:
        items = frame if items is None else items.unionByName(frame)
    return items, texts, found


def lm_eval_items(eval_set: EvalSet) -> tuple[list[str], dict]:
    """Prompt plus gold answer of every evaluation document of each task present locally (no download)."""
    found: dict[str, Any] = {"tasks": {}, "missing": {}}
    try:
        from lm_eval.tasks import TaskManager, get_task_dict
    except ImportError:
        return [], {
            "tasks": {},
            "missing": dict.fromkeys(eval_set.tasks, "lm-evaluation-harness is not installed"),
        }
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    manager = TaskManager(include_path=eval_set.include_path)
    texts: list[str] = []
    for name in eval_set.tasks:
        try:
            tasks = get_task_dict([name], manager)
        except Exception as exc:  # not present locally, or not a task: skipped, named in the manifest
            found["missing"][name] = f"{type(exc).__name__}: {str(exc)[:200]}"
            log.warning("decontaminate: lm-eval task %s skipped: %s", name, exc)
            continue
        for task_name, task in _leaf_tasks(tasks):
            count = 0
            for doc in task.eval_docs:
                texts.append(_item_text(task, doc))
                count += 1
            found["tasks"][task_name] = count
    return texts, found


def _leaf_tasks(tasks: dict) -> list[tuple[str, Any]]:
    leaves = []
    for name, task in tasks.items():
        if isinstance(task, dict):
            leaves.extend(_leaf_tasks(task))
        else:
            leaves.append((str(name), task))
    return leaves


def _item_text(task, doc) -> str:
    prompt = str(task.doc_to_text(doc))
    target = task.doc_to_target(doc)
    if task.OUTPUT_TYPE == "multiple_choice":
        choices = task.doc_to_choice(doc)
        if isinstance(target, int) and 0 <= target < len(choices):
            target = choices[target]
    if isinstance(target, list):
        target = " ".join(map(str, target))
    return f"{prompt} {target}"


def file_items(spark: SparkSession, eval_set: EvalSet) -> DataFrame:
    from pyspark.sql import functions as F

    assert eval_set.path is not None  # a file set's validator requires its path
    fmt, files = source_files(eval_set.path)
    if fmt == "jsonl":
        frame = spark.read.json(files)
    elif fmt == "parquet":
        frame = spark.read.parquet(*files)
    else:
        frame = spark.read.text(files, wholetext=True).withColumnRenamed("value", "text")
    missing = [name for name in eval_set.fields if name not in frame.columns]
    if missing:
        from pipeline.core.config import ConfigError

        raise ConfigError(
            f"decontaminate.sets[{eval_set.name}]: {eval_set.path} has no field {missing}; columns: {frame.columns}"
        )
    return frame.select(
        F.concat_ws(" ", *[F.col(name).cast("string") for name in eval_set.fields]).alias("text")
    )
