"""Checkpoints written before the one loader still resume: the loader states the four earlier loader classes
wrote (``packed``, ``token_budget``, ``blended_packed``, ``blended_token_budget``), written out here field by
field, load into ``TrainLoader`` and continue with the batches the earlier code read next (their digests were
recorded from it), on the same number of ranks or resharded; and the loader still writes that layout."""

from __future__ import annotations

import hashlib

import pytest

from pipeline.data.batching import Packed, TokenBudget
from pipeline.data.loader import TrainLoader
from pipeline.data.sequences import DocumentSequences, PackedSequences
from tests.data.test_blend import checkpointed, write_source

SEED = 7
STEPS = 50  # steps of two ranks before the checkpoint: past an epoch's end in every kind


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    made = []
    for index, (counts, longest) in enumerate([([50, 30], 50), ([25], 30)]):
        folder = root / f"s{index}" / "train"
        write_source(
            folder, index, counts, lambda r, longest=longest: int(r.integers(2, longest)), seed=index + 20
        )
        made.append(folder)
    return made


def make(kind, folders, rank, world_size):
    ranks = {"rank": rank, "world_size": world_size, "seed": SEED}
    budget = TokenBudget(64, pad_id=1, pool_size=20)
    if kind == "packed":
        return TrainLoader.one_snapshot(PackedSequences(folders[0], 8), Packed(3), **ranks)
    if kind == "token_budget":
        return TrainLoader.one_snapshot(DocumentSequences(folders[0], 16), budget, **ranks)
    names, weights = ["a", "b"], [0.7, 0.3]
    if kind == "blended_packed":
        datasets = [PackedSequences(folder, 8) for folder in folders]
        return TrainLoader.mixture(names, datasets, weights, Packed(3), **ranks)
    datasets = [DocumentSequences(folder, 16) for folder in folders]
    return TrainLoader.mixture(names, datasets, weights, budget, **ranks)


def digest(batches) -> str:
    hashed = hashlib.sha256()
    for batch in batches:
        for tensor in (*batch, batch.sources) if batch.sources is not None else batch:
            hashed.update(str(tuple(tensor.shape)).encode())
            hashed.update(tensor.numpy().tobytes())
    return hashed.hexdigest()[:20]


# The state rank 0 of two wrote after STEPS steps, as the earlier loaders laid it out.
OLD_STATES = {
    "packed": {
        "version": 1,
        "kind": "packed",
        "epoch": 1,
        "position": 24,
        "world_size": 2,
        "seed": 7,
        "dataset": "packed:8:0802bf7efa63f3e1",
        "batch_size": 3,
    },
    "token_budget": {
        "version": 1,
        "kind": "token_budget",
        "epoch": 2,
        "position": 16,
        "world_size": 2,
        "seed": 7,
        "dataset": "documents:16:0802bf7efa63f3e1",
        "max_tokens": 64,
        "pool_size": 20,
    },
    "blended_packed": {
        "version": 1,
        "kind": "blended_packed",
        "position": 300,
        "world_size": 2,
        "seed": 7,
        "sources": ["a", "b"],
        "weights": [0.7, 0.3],
        "period": 65536,
        "datasets": ["packed:8:0802bf7efa63f3e1", "packed:8:dd83b70b7ef49f49"],
        "source_samples": {"a": 210, "b": 90},
        "source_epochs": {"a": 0.7608695652173914, "b": 1.836734693877551},
        "batch_size": 3,
    },
    "blended_token_budget": {
        "version": 1,
        "kind": "blended_token_budget",
        "position": 100,
        "world_size": 2,
        "seed": 7,
        "sources": ["a", "b"],
        "weights": [0.7, 0.3],
        "period": 65536,
        "datasets": ["documents:16:0802bf7efa63f3e1", "documents:16:dd83b70b7ef49f49"],
        "max_tokens": 64,
        "pool_size": 20,
        "source_samples": {"a": 68, "b": 32},
        "source_epochs": {"a": 1.6046511627906976, "b": 4.0},
    },
}

# Digests of the next 12 batches the earlier code read after loading that state, per "world_size/rank".
OLD_CONTINUATIONS = {
    "packed": {
        "1/0": "e375fe2f7830596f6958",
        "2/0": "bf06bc100c12cdb4a470",
        "2/1": "5dbc4bd2d5f9d837a1bf",
        "3/0": "3632ee8d9fa42149d2ae",
        "3/1": "98b56f01322baab727ec",
        "3/2": "cf5e62989964b2e2da4e",
    },
    "token_budget": {
        "1/0": "4977c0d1e62572c1ce52",
        "2/0": "261461538cea6743c1e6",
        "2/1": "0527c1aa80f9635e0644",
        "3/0": "8acfd1f78dabe0224102",
        "3/1": "0a6e465056a55f958804",
        "3/2": "f0b6ad97a4634a219474",
    },
    "blended_packed": {
        "1/0": "13e4f50b62d7cb225e03",
        "2/0": "e9368e7081b6338e62ce",
        "2/1": "15127adef344607a8326",
        "3/0": "739bc51bca4a9b2b95f4",
        "3/1": "a8f0cb2ee4537e072a43",
        "3/2": "9006a58e271f5379ee5a",
    },
    "blended_token_budget": {
        "1/0": "78b0d1699fa20919debc",
        "2/0": "2c4f688c9c2ef2b38126",
        "2/1": "7d6b2dad3da17d7d000b",
        "3/0": "6fb623adea38cd5c4c23",
        "3/1": "68601ddac7f8ecaa220b",
        "3/2": "8c53aea21009fc2a826a",
    },
}


@pytest.mark.parametrize("kind", sorted(OLD_STATES))
def test_an_earlier_runs_loader_state_resumes_with_the_batches_it_would_have_read(folders, kind):
    state = checkpointed(OLD_STATES[kind])
    for key, expected in OLD_CONTINUATIONS[kind].items():
        world_size, rank = map(int, key.split("/"))
        loader = make(kind, folders, rank, world_size)
        loader.load_state_dict(state)
        assert digest([next(loader) for _ in range(12)]) == expected, key


@pytest.mark.parametrize("kind", sorted(OLD_STATES))
def test_the_loader_still_writes_the_earlier_layout(folders, kind):
    ranks = [make(kind, folders, rank, 2) for rank in range(2)]
    for _ in range(STEPS):
        for loader in ranks:
            next(loader)
    state = ranks[0].state_dict()
    assert state == OLD_STATES[kind]
    assert list(state) == list(OLD_STATES[kind])
