"""What the trainer tests share: a small tokenized corpus written without Spark (a real BPE over generated text),
the processes they start and kill, and one training launched under torchrun or run in this process."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from tokenizers import Tokenizer

from pipeline.config import PipelineConfig
from pipeline.core.manifest import Manifest
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.data.mixture import TOKENIZER_FACTS
from pipeline.data.shards import ShardWriter
from pipeline.data.tokenizer_files import DIGEST_FILES
from pipeline.tokenization.bpe import TOKENIZER_FILE, save_tokenizer, train_tokenizer
from pipeline.tokenization.config import TokenizerConfig
from pipeline.train.launcher.launch import child_environment

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
    config: PipelineConfig,
    snapshot: str,
    documents: int = 400,
    seed: int = 7,
    corpus: str | None = None,
    tokenizer_seed: int | None = None,
    tokenizer_from: DatasetRef | None = None,
) -> DatasetRef:
    """A published tokenize output (train + validation shards, tokenizer.json, manifest) for ``snapshot`` of
    ``corpus`` (default project.corpus). Its BPE is trained on its own texts, or with ``tokenizer_seed`` on
    the texts of that seed, so outputs given one tokenizer_seed share one tokenizer (a mixture's); or it is
    the tokenizer of the tokenize output ``tokenizer_from`` (its files and facts, so its digest too)."""
    texts = generated_documents(documents, seed)
    tokenizer_config = TokenizerConfig(vocab_size=320, min_frequency=1)
    if tokenizer_from is not None:
        tokenizer = Tokenizer.from_file(str(tokenizer_from.path / TOKENIZER_FILE))
        facts = {key: tokenizer_from.manifest().extra.get(key) for key in (*TOKENIZER_FACTS, "tokenizer")}
        eos_id = facts["eos_id"]
    else:
        tokenizer_texts = texts if tokenizer_seed is None else generated_documents(400, tokenizer_seed)
        tokenizer = train_tokenizer(tokenizer_texts, tokenizer_config)
        eos_id = tokenizer.token_to_id(tokenizer_config.eos_token)
        facts = {
            "vocab_size": tokenizer.get_vocab_size(),
            "eos_id": eos_id,
            "pad_id": tokenizer.token_to_id(tokenizer_config.pad_token),
            "eos_token": tokenizer_config.eos_token,
            "pad_token": tokenizer_config.pad_token,
        }
    if corpus is not None:
        config = config.model_copy(update={"project": config.project.model_copy(update={"corpus": corpus})})
    ref = DatasetRef.of(config, "tokenize", snapshot)
    validation = len(texts) // 10
    with StageOutput(ref, config, []) as out:
        if tokenizer_from is not None:
            for name in DIGEST_FILES:
                shutil.copyfile(tokenizer_from.path / name, out.path / name)
        else:
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
                    out.path / split / f"shard-{number:05d}-0000", np.dtype(facts.get("dtype") or "uint16")
                ) as writer:
                    for document in shard:
                        writer.add_document(document)
        out.commit(
            rows={"train_documents": len(texts) - validation, "validation_documents": validation},
            counters={
                "tokens": {
                    split: sum(len(document) for shard in shards for document in shard)
                    for split, shards in splits.items()
                }
            },
            extra=facts,
        )
    return ref


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- processes: every multi-process test kills what it started, whatever happens ----------------------


def process_tree(pid: int) -> list[psutil.Process]:
    """A process and every descendant (torchrun starts each rank in a session of its own)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    def running(process: psutil.Process) -> bool:
        try:
            return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return [process for process in processes if running(process)]


def processes_mentioning(marker: str) -> list[psutil.Process]:
    """Live processes whose command line mentions ``marker`` (a test's own data root: its config file is in
    the argv of the launcher, the torchrun agent and every rank), wherever they were reparented."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if marker in " ".join(process.info["cmdline"] or []) and alive([process]):
            found.append(process)
    return found


def wait_gone(processes: list[psutil.Process], timeout_s: float = 120) -> list[psutil.Process]:
    """Wait until every process has exited; returns (after SIGKILLing them) those still alive past the guard."""
    _, still_alive = psutil.wait_procs(processes, timeout=timeout_s)
    for process in still_alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    return still_alive


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL the process's group (it was started in a session of its own) and every descendant."""
    tree = process_tree(process.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    for member in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()


def start(command: list[str], env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    """``command`` in a session of its own (so the test can kill its group), stdout and stderr merged."""
    return subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        **popen,
    )


def finish(process: subprocess.Popen, expect_success: bool = True, timeout_s: float = 300) -> str:
    """Wait for the process and return its output; past ``timeout_s`` (a guard against a hang, not a speed
    check) its whole tree is killed and the test fails."""
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_tree(process)
        output, _ = process.communicate()
        pytest.fail(f"{process.args[:4]} still running after {timeout_s} s; killed:\n{output[-5000:]}")
    if expect_success:
        assert process.returncode == 0, output[-5000:]
    return output


@contextlib.contextmanager
def hard_timeout(process: subprocess.Popen, timeout_s: float = 300) -> Iterator[subprocess.Popen]:
    """For a test that talks to the process while it runs: past ``timeout_s`` its tree is killed (so any
    read from it ends), and it is killed when the block ends in any case."""
    timer = threading.Timer(timeout_s, kill_tree, args=(process,))
    timer.daemon = True
    timer.start()
    try:
        yield process
    finally:
        timer.cancel()
        kill_tree(process)
        process.communicate()


def pretrain_train(config_path: Path, snapshot: str, *overrides: str) -> list[str]:
    """The `pretrain train` launcher's command line."""
    sets = [arg for override in overrides for arg in ("--set", override)]
    return [
        sys.executable,
        "-m",
        "pipeline.train",
        "--config",
        str(config_path),
        "--snapshot",
        snapshot,
        *sets,
    ]


TORCHRUN_RUN = "by-hand"  # the run ``torchrun`` trains: ranks train the run their launcher names


def torchrun(
    args: list[str],
    config_path: Path,
    snapshot: str,
    env: dict[str, str] | None = None,
    run_id: str = TORCHRUN_RUN,
    **popen,
):
    """Start ``torchrun <args> -m pipeline.train`` on a written config, as a user starting torchrun by hand does:
    naming the run (``train.run_id``), which `pretrain train` decides for its own torchrun. Returns the Popen
    (see ``finish``)."""
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
        "--set",
        f"train.run_id={run_id}",
    ]
    environment = {**child_environment(), "OMP_NUM_THREADS": "1", **(env or {})}  # what the stage passes
    return start(command, env=environment, **popen)


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


def unfinished_run(config: PipelineConfig, snapshot: str) -> Path:
    """The staging folder of the snapshot's one unfinished training run."""
    (staging,) = DatasetRef.of(config, "train", snapshot).snapshot_path.glob(".staging-*@resume")
    return staging


def losses(config: PipelineConfig, snapshot: str, staging: bool = False) -> list[float]:
    """The logged training losses of a run, by step (the latest complete run, or the one unfinished run)."""
    path = unfinished_run(config, snapshot) if staging else DatasetRef.of(config, "train", snapshot).path
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "loss" in row]


def write_config(config: PipelineConfig, path: Path) -> Path:
    path.write_text(config.to_yaml())
    return path


# --- one training, as the multi-process tests start it ------------------------------------------------------


def prepared(root: Path, snapshot: str, *overrides: str) -> tuple[PipelineConfig, Path]:
    """A ``train_config`` on ``root/data``, the token corpus of ``snapshot`` there, and the config file a
    launch reads (``root/config.yaml``)."""
    config = train_config(root / "data", *overrides)
    write_token_corpus(config, snapshot)
    return config, write_config(config, root / "config.yaml")


def standalone(
    path: Path,
    snapshot: str,
    ranks: int,
    *args: str,
    env: dict[str, str] | None = None,
    expect_success: bool = True,
) -> str:
    """``torchrun --standalone --nproc-per-node=<ranks> <args>`` of a written config, to its end: its output."""
    process = torchrun(["--standalone", f"--nproc-per-node={ranks}", *args], path, snapshot, env=env)
    return finish(process, expect_success=expect_success)


def launched(
    root: Path,
    snapshot: str,
    ranks: int,
    *overrides: str,
    env: dict[str, str] | None = None,
    expect_success: bool = True,
) -> tuple[PipelineConfig, Path, str]:
    """``prepared`` then ``standalone``: the config, its file and the launch's output."""
    config, path = prepared(root, snapshot, *overrides)
    return config, path, standalone(path, snapshot, ranks, env=env, expect_success=expect_success)


def trained_in_one_process(root: Path, snapshot: str, *overrides: str) -> tuple[PipelineConfig, Manifest]:
    """A ``train_config`` on ``root/data`` trained here as a one-rank group (no torchrun): the config and its
    published manifest."""
    from pipeline.train.trainer import train  # torch: only for the tests that train here

    config = single_process(train_config(root / "data", *overrides), root)
    write_token_corpus(config, snapshot)
    manifest = train(config, snapshot)
    assert manifest is not None
    return config, manifest
