"""A finished training run as the stages after it see it: its final checkpoint, its tokenizer and its lineage."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from pipeline.core.manifest import Manifest, upstream_manifests
from pipeline.core.storage import DatasetRef, StageFailure


@dataclass(frozen=True)
class SpecialTokens:
    """The token ids a trained model's tokenizer reserves, as its tokenize output recorded them."""

    eos_id: int
    pad_id: int | None
    bos_id: int | None = None  # documents start after an end-of-text, so by default bos is eos

    @property
    def bos(self) -> int:
        return self.eos_id if self.bos_id is None else self.bos_id


@dataclass(frozen=True)
class TrainedRun:
    ref: DatasetRef
    manifest: Manifest
    chain: tuple[Manifest, ...]  # the manifests it was made from, nearest first

    @classmethod
    def of(cls, ref: DatasetRef) -> TrainedRun:
        manifest = ref.manifest()
        return cls(ref, manifest, tuple(upstream_manifests(manifest)))

    @property
    def checkpoint(self) -> Path:
        return self.ref.path / self.manifest.extra["checkpoint"]

    def upstream(self, stage: str) -> Manifest | None:
        return next((m for m in self.chain if m.stage == stage), None)

    @property
    def tokenize(self) -> Manifest:
        found = self.upstream("tokenize")
        if found is None:
            raise StageFailure(
                f"{self.ref.what} names no tokenize output among its inputs; no tokenizer to use"
            )
        return found

    @property
    def tokenizer_file(self) -> Path:
        return Path(self.tokenize.path) / "tokenizer.json"

    def special_tokens(self) -> SpecialTokens:
        extra = self.tokenize.extra
        return SpecialTokens(eos_id=extra["eos_id"], pad_id=extra.get("pad_id"))

    def added_special_tokens(self) -> list[str]:
        """The tokenizer's special tokens other than end-of-text and padding (the reserved ones)."""
        data = json.loads(self.tokenizer_file.read_text())
        named = {self.tokenize.extra["eos_token"], self.tokenize.extra.get("pad_token")}
        return [
            t["content"]
            for t in data.get("added_tokens", [])
            if t.get("special") and t["content"] not in named
        ]

    def verify_checkpoint(self) -> None:
        """The final checkpoint's files (every pipeline shard's) against the digests the run's manifest
        recorded when it was published; DamagedInputError names the first that differs."""
        from pipeline.model.checkpoint import step_files

        self.ref.verify(*(file.relative_to(self.ref.path).as_posix() for file in step_files(self.checkpoint)))

    @cached_property
    def state(self) -> dict[str, Any]:
        """The final checkpoint, verified against the run's manifest and its checksum files; a
        pipeline-parallel run's parts merged into one model."""
        from pipeline.model.checkpoint import whole_model_checkpoint

        self.verify_checkpoint()
        return whole_model_checkpoint(self.checkpoint)

    @property
    def model_config(self):
        from pipeline.model import GPTConfig

        return GPTConfig(**self.state["model_config"])

    def model(self):
        """Our GPT with the final weights, in eval mode."""
        from pipeline.model.checkpoint import model_from_state

        return model_from_state(self.state)

    def lineage(self) -> dict[str, Any]:
        """What the model card and the registry say the model was made from."""
        return {
            "corpus": self.ref.corpus,
            "snapshot": self.ref.snapshot,
            "train_run": self.ref.run,
            "train_digest": self.manifest.digest,
            "dataset_digests": {m.stage: m.digest for m in self.chain},
            "steps": self.manifest.rows.get("steps"),
            "tokens_seen": self.manifest.counters.get("tokens_seen"),
            "final_loss": self.manifest.extra.get("final_loss"),
            "val_loss": self.manifest.extra.get("val_loss"),
            "mlflow_run_id": self.manifest.extra.get("mlflow_run_id"),
            "code_version": self.manifest.code_version,
            "config_hash": self.manifest.config_hash,
            "tokenizer_digest": self.manifest.extra.get("tokenizer_digest"),
            "inputs": self.inputs(),
        }

    def inputs(self) -> list[dict[str, Any]]:
        """Every token-shard output the run read (source, weight, corpus, snapshot, manifest digest), as the
        trainer recorded them; for a run from before that record, its manifest's input references."""
        recorded = self.manifest.extra.get("inputs")
        if recorded:
            return [dict(entry) for entry in recorded]
        return [
            {"source": self.ref.corpus, "weight": 1.0, "corpus": self.ref.corpus, **ref}
            for ref in self.manifest.inputs
        ]
