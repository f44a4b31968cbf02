"""Training runs: every training of a snapshot writes an output of its own, so none replaces another.

    train/<snapshot>/
      latest -> <run>             the newest complete run (a symlink, replaced in one rename after a publish)
      <run>/                      a complete run, published atomically and never trained again:
                                  checkpoints/, metrics.jsonl, run.json, manifest.json, _SUCCESS
      .staging-<run>@resume/      an unfinished run, which a resume continues
      .lock-<run>                 held by whoever trains that run (launcher, torchrun agent, ranks)

``decide_run`` says which run a training writes, once, in its launcher: the one ``train.run_id`` names
(unless it is complete); else, with ``train.resume`` (the default), the newest unfinished run that was trained
with the same settings (``RESUME_SETTINGS``, recorded in its ``run.json``); else a new run named after the
time it starts. The launcher hands it to torchrun as ``train.run_id``, and the ranks only check it. So killing a run and running the same command again resumes it, a sweep (other settings each time,
one after another or at once) gets one run per setting, and the report of a run,
``report/<snapshot>/<run>/``, points at checkpoints that stay.

No torch here: the launcher imports it before torchrun starts.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.core.config import ConfigError
from pipeline.core.storage import RESUMABLE_TAG, STAGING_PREFIX, DatasetRef, validate_run_id

log = logging.getLogger(__name__)
STAGE = "train"
RUN_RECORD = "run.json"

# Settings a checkpoint must share with the run resuming it: the model, the data order and the optimisation
# trajectory. Everything else (ranks, batch split, logging, compression, ZeRO) may change between attempts.
RESUME_SETTINGS = (
    "model.",
    "data.",
    "project.seed",
    "train.seq_len",
    "train.steps",
    "train.lr",
    "train.min_lr_ratio",
    "train.warmup_steps",
    "train.weight_decay",
    "train.betas",
    "train.precision",
)


# Only a Muon run is told apart by them: an AdamW run ignores Muon's keys, and runs recorded before they
# existed (AdamW) stay resumable.
MUON_SETTINGS = (
    "train.optimizer",
    "train.muon_lr",
    "train.muon_momentum",
    "train.muon_weight_decay",
    "train.muon_adjust_lr",
)


def resume_identity(config: PipelineConfig) -> dict[str, Any]:
    flat = config.flat()
    ignored = MUON_SETTINGS if config.train.optimizer == "adamw" else ()
    return {
        key: value
        for key, value in sorted(flat.items())
        if key not in ignored
        and any(
            key == setting or (setting.endswith(".") and key.startswith(setting))
            for setting in (*RESUME_SETTINGS, *MUON_SETTINGS)
        )
    }


def identity_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    keys = sorted(set(saved) | set(current))
    return [
        f"{key}: checkpoint {saved.get(key)!r}, this run {current.get(key)!r}"
        for key in keys
        if saved.get(key) != current.get(key)
    ]


@dataclass(frozen=True)
class RunRecord:
    """``run.json`` in a run's folder: what a later training compares before resuming it, and (written by
    its rank 0) what it was trained on: every input manifest and the tokenizer digest, and at the end how
    many samples and passes each mixture source gave."""

    run_id: str
    created_at: str
    config_hash: str
    resume_identity: dict[str, Any]
    inputs: list[dict[str, Any]] = field(default_factory=list)
    tokenizer_digest: str | None = None
    mixture: list[str] | None = None  # the declared mixture's source names; None: one snapshot
    source_samples: dict[str, int] | None = None
    source_epochs: dict[str, float] | None = None

    @classmethod
    def read(cls, folder: Path) -> RunRecord | None:
        try:
            return cls(**json.loads((folder / RUN_RECORD).read_text()))
        except (OSError, ValueError, TypeError):
            return None


def record_run(folder: Path, config: PipelineConfig, run_id: str) -> RunRecord:
    """Write the run's ``run.json`` into ``folder`` unless it is there (a resume keeps the first one)."""
    existing = RunRecord.read(folder)
    if existing is not None:
        return existing
    record = RunRecord(
        run_id=run_id,
        created_at=datetime.now(UTC).isoformat(timespec="microseconds"),
        config_hash=config.hash,
        resume_identity=resume_identity(config),
    )
    _write_record(folder, record)
    return record


def update_run_record(folder: Path, **changes: Any) -> RunRecord:
    """Rewrite ``run.json`` in ``folder`` with ``changes`` (RunRecord fields), atomically."""
    existing = RunRecord.read(folder)
    if existing is None:
        raise FileNotFoundError(f"no readable {RUN_RECORD} in {folder}")
    record = replace(existing, **changes)
    _write_record(folder, record)
    return record


def _write_record(folder: Path, record: RunRecord) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f".{RUN_RECORD}.tmp-{secrets.token_hex(4)}"
    temporary.write_text(json.dumps(asdict(record), indent=2, sort_keys=True) + "\n")
    temporary.replace(folder / RUN_RECORD)


def new_run_id() -> str:
    """``20261201-101530-3f9a2c``: sorts by start time; the random tail keeps runs started together apart."""
    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def run_ref(config: PipelineConfig, snapshot: str, run_id: str) -> DatasetRef:
    return DatasetRef.of(config, STAGE, snapshot, run=run_id)


def unfinished_runs(config: PipelineConfig, snapshot: str) -> list[RunRecord]:
    """The snapshot's unfinished runs that recorded their settings, newest first."""
    folder = DatasetRef.of(config, STAGE, snapshot).snapshot_path
    records = [
        record
        for staging in folder.glob(f"{STAGING_PREFIX}*@{RESUMABLE_TAG}")
        if (record := RunRecord.read(staging)) is not None
    ]
    return sorted(records, key=lambda record: (record.created_at, record.run_id), reverse=True)


def _trainable(config: PipelineConfig, snapshot: str, run_id: str) -> str:
    ref = run_ref(config, snapshot, run_id)
    if ref.is_complete():
        raise ConfigError(
            f"train.run_id={run_id}: that run of snapshot {snapshot!r} is complete ({ref.path}) "
            "and is never trained again; name a new run, or leave train.run_id unset for one"
        )
    return run_id


def decide_run(config: PipelineConfig, snapshot: str, default: str | None = None) -> str:
    """The run a training writes, decided once, by whoever launches it (`pretrain train`, the Airflow operator):
    the one ``train.run_id`` names (unless it is complete); else ``default`` (the name a launcher gives its
    runs: the Kubernetes job's, so a resubmitted job resumes its run); else, with ``train.resume`` (the
    default), the newest unfinished run trained with the same settings; else a new run named after the time it
    starts. The launcher passes it down as ``train.run_id``; ranks only check it (``launched_run``)."""
    train = config.train
    if train.run_id is not None:
        return _trainable(config, snapshot, train.run_id)
    if default is not None:
        return _trainable(config, snapshot, validate_run_id(default))
    if train.resume:
        identity = resume_identity(config)
        for record in unfinished_runs(config, snapshot):
            differences = identity_differences(record.resume_identity, identity)
            if not differences:
                log.info("resuming the unfinished run %s of snapshot %s", record.run_id, snapshot)
                return record.run_id
            log.info(
                "unfinished run %s of snapshot %s has other settings (%s%s); leaving it for a training with "
                "those settings or train.run_id=%s",
                record.run_id,
                snapshot,
                differences[0],
                f" and {len(differences) - 1} more" if len(differences) > 1 else "",
                record.run_id,
            )
    run_id = new_run_id()
    log.info("new training run %s of snapshot %s", run_id, snapshot)
    return run_id


def launched_run(config: PipelineConfig, snapshot: str) -> str:
    """The run a rank trains: the one its launcher decided and named in ``train.run_id``, checked, never chosen
    here (every rank of every node must train the same run)."""
    if config.train.run_id is None:
        raise ConfigError(
            "train.run_id is unset: a rank trains the run its launcher decided. Start training with "
            "`pretrain train` (it launches torchrun for you), or name the run with train.run_id=<name> when "
            "you start torchrun yourself"
        )
    return _trainable(config, snapshot, config.train.run_id)
