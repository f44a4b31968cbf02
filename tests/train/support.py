"""A small tokenized corpus for trainer tests, written without Spark: a real BPE over generated text."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

from pipeline.config import PipelineConfig
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.tokenization.bpe import save_tokenizer, train_tokenizer
from pipeline.tokenization.config import TokenizerConfig
from pipeline.tokenization.shards import ShardWriter
from pipeline.train.launch import child_environment

WORDS = [
    "the",
    "bee",
    "hive",
    "garden",
    "flower",
    "honey",
    "queen",
    "worker",
    "summer",
    "pollen",
    "nectar",
    "wax",
    "comb",
    "swarm",
    "field",
    "meadow",
    "sun",
    "rain",
    "colony",
    "keeper",
    "smoke",
    "frame",
    "brood",
    "drone",
    "forage",
    "clover",
    "lavender",
    "apple",
    "blossom",
    "morning",
    "evening",
    "warm",
    "cold",
]


def generated_documents(count: int, seed: int) -> list[str]:
    """Sentences from a sparse Markov chain over a small vocabulary, so a tiny model can learn something."""
    rng = np.random.default_rng(seed)
    successors = {word: rng.choice(len(WORDS), size=3, replace=False) for word in WORDS}
    documents = []
    for _ in range(count):
        word = WORDS[rng.integers(len(WORDS))]
        sentence = [word]
        for _ in range(int(rng.integers(15, 90))):
            word = WORDS[successors[word][rng.integers(3)]]
            sentence.append(word)
        documents.append(" ".join(sentence).capitalize() + ".")
    return documents


def write_token_corpus(
    config: PipelineConfig, snapshot: str, documents: int = 400, seed: int = 7
) -> DatasetRef:
    """A published tokenize output (train + validation shards, tokenizer.json, manifest) for ``snapshot``."""
    texts = generated_documents(documents, seed)
    tokenizer_config = TokenizerConfig(vocab_size=320, min_frequency=1)
    tokenizer = train_tokenizer(texts, tokenizer_config)
    eos_id = tokenizer.token_to_id(tokenizer_config.eos_token)
    ref = DatasetRef.of(config, "tokenize", snapshot)
    validation = len(texts) // 10
    with StageOutput(ref, config, []) as out:
        save_tokenizer(tokenizer, out.path, tokenizer_config)
        encoded = [[*encoding.ids, eos_id] for encoding in tokenizer.encode_batch(texts)]
        splits = {
            "validation": [encoded[:validation]],
            "train": [encoded[validation::2], encoded[validation + 1 :: 2]],
        }
        for split, shards in splits.items():
            (out.path / split).mkdir()
            for number, shard in enumerate(shards):
                with ShardWriter(
                    out.path / split / f"shard-{number:05d}-0000", np.dtype(np.uint16)
                ) as writer:
                    for document in shard:
                        writer.add_document(document)
        out.commit(
            rows={"train_documents": len(texts) - validation, "validation_documents": validation},
            extra={
                "vocab_size": tokenizer.get_vocab_size(),
                "eos_id": eos_id,
                "pad_id": tokenizer.token_to_id(tokenizer_config.pad_token),
            },
        )
    return ref


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(args: list[str], config_path: Path, snapshot: str, env: dict[str, str] | None = None, **popen):
    """Start ``torchrun <args> -m pipeline.train`` on a written config; returns the Popen."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *args,
        "-m",
        "pipeline.train",
        "--config",
        str(config_path),
        "--snapshot",
        snapshot,
    ]
    environment = {**child_environment(), "OMP_NUM_THREADS": "1", **(env or {})}  # what the stage passes
    return subprocess.Popen(
        command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen
    )


def train_config(data_root: Path, *overrides: str) -> PipelineConfig:
    """A tiny-model training config on ``data_root``: quick steps, no MLflow unless a test asks for it."""
    from tests.conftest import make_config

    return make_config(
        data_root,
        "train.steps=8",
        "train.checkpoint_every=3",
        "train.batch_size=4",
        "train.warmup_steps=2",
        "train.eval_sequences=16",
        "train.histogram_every=0",
        "tracking.stage_runs=false",
        "tracking.tensorboard=false",
        "tracking.sample_tokens=0",
        *overrides,
    )


def single_process(config: PipelineConfig, tmp_path: Path) -> PipelineConfig:
    """The same config as one rank of a one-process group (file:// rendezvous, no torchrun)."""
    store = tmp_path / f"pg-{os.urandom(4).hex()}"
    return config.model_copy(
        update={
            "distributed": config.distributed.model_copy(
                update={"init_method": f"file://{store}", "rank": 0, "world_size": 1}
            )
        }
    )


def losses(config: PipelineConfig, snapshot: str, staging: bool = False) -> list[float]:
    """The logged training losses of a run, by step (the published output, or the unfinished staging one)."""
    ref = DatasetRef.of(config, "train", snapshot)
    path = StageOutput(ref, config, [], resumable=True).path if staging else ref.path
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "loss" in row]


def write_config(config: PipelineConfig, path: Path) -> Path:
    path.write_text(config.to_yaml())
    return path
