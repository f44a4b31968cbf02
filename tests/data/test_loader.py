import functools
import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.data.batching import Packed, TokenBudget, batching_for, token_budget_batches
from pipeline.data.loader import TrainLoader
from pipeline.data.sequences import IGNORE_INDEX, PAD_DOCUMENT, DocumentSequences, PackedSequences
from pipeline.data.shards import ShardFormatError, ShardWriter
from tests.conftest import make_config


def write_shards(folder, documents_per_shard, rng, length_sampler):
    """Random documents (each ending in EOS id 0) in several shards; returns them in stream order."""
    folder.mkdir(parents=True, exist_ok=True)
    documents = []
    for shard, count in enumerate(documents_per_shard):
        with ShardWriter(folder / f"shard-{shard:05d}-0000", np.dtype(np.uint16)) as writer:
            for _ in range(count):
                document = [*rng.integers(1, 1000, size=length_sampler(rng) - 1).tolist(), 0]
                writer.add_document(document)
                documents.append(document)
    return documents


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(1)
    documents = write_shards(tmp_path / "train", [30, 0, 25, 20], rng, lambda r: int(r.integers(2, 60)))
    return tmp_path / "train", documents


def packed_loader(dataset, batch_size, **kwargs):
    return TrainLoader.one_snapshot(dataset, Packed(batch_size), **kwargs)


def budget_loader(dataset, max_tokens, pad_id, pool_size=16_384, **kwargs):
    return TrainLoader.one_snapshot(dataset, TokenBudget(max_tokens, pad_id, pool_size), **kwargs)


def reference_stream(documents):
    """Token stream and per-token document index, by plain loops."""
    tokens, owners = [], []
    for index, document in enumerate(documents):
        tokens += document
        owners += [index] * len(document)
    return tokens, owners


def test_windows_and_document_ids_match_a_loop_over_the_documents(corpus):
    folder, documents = corpus
    tokens, owners = reference_stream(documents)
    dataset = PackedSequences(folder, seq_len=16)
    assert len(dataset) == (len(tokens) - 1) // 16
    for i in range(len(dataset)):
        start = i * 16
        assert dataset[i].tolist() == tokens[start : start + 17]
        expected = [owner - owners[start] for owner in owners[start : start + 17]]
        assert dataset.document_ids(i).tolist() == expected
    assert all(isinstance(shard.tokens, np.memmap) for shard in dataset.stream.shards if shard.num_tokens)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_stream_reads_any_range_across_shards(tmp_path_factory, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    counts = data.draw(st.lists(st.integers(0, 6), min_size=1, max_size=5).filter(any))
    folder = tmp_path_factory.mktemp("stream")
    documents = write_shards(folder, counts, rng, lambda r: int(r.integers(1, 9)))
    tokens, _ = reference_stream(documents)
    stream = PackedSequences(folder, 1).stream if len(tokens) > 1 else None
    if stream is None:
        return
    start = data.draw(st.integers(0, len(tokens)))
    stop = data.draw(st.integers(start, len(tokens)))
    assert stream.read(start, stop).tolist() == tokens[start:stop]


def batches(loader, steps):
    return [next(loader) for _ in range(steps)]


def test_ranks_split_each_step_of_the_epoch_order(corpus):
    folder, _ = corpus
    dataset = PackedSequences(folder, seq_len=16)
    loaders = [packed_loader(dataset, batch_size=3, rank=r, world_size=2, seed=3) for r in range(2)]
    steps = loaders[0].order.batches_per_epoch
    seen = []
    for _ in range(steps):
        for loader in loaders:
            batch = next(loader)
            assert batch.inputs.shape == batch.targets.shape == batch.document_ids.shape == (3, 16)
            assert batch.inputs.dtype == batch.targets.dtype == batch.document_ids.dtype == torch.int64
            assert torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])
            seen += [tuple(row.tolist()) for row in batch.inputs]
    windows = {tuple(dataset[i][:-1].tolist()) for i in range(len(dataset))}
    assert len(seen) == len(set(seen)) == steps * 6
    assert set(seen) <= windows and len(windows) - len(seen) < 6  # only the incomplete last step is dropped


def test_same_seed_same_batches_other_seed_other_batches(corpus):
    folder, _ = corpus
    dataset = PackedSequences(folder, seq_len=8)
    first = batches(packed_loader(dataset, 4, seed=5), 12)
    again = batches(packed_loader(PackedSequences(folder, seq_len=8), 4, seed=5), 12)
    other = batches(packed_loader(dataset, 4, seed=6), 12)
    assert all(torch.equal(a.inputs, b.inputs) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a.inputs, b.inputs) for a, b in zip(first, other, strict=True))


@pytest.mark.parametrize("world_size", [1, 2])
def test_packed_resume_mid_epoch_gives_the_identical_batch_sequence(corpus, world_size):
    folder, _ = corpus
    dataset = PackedSequences(folder, seq_len=16)
    for rank in range(world_size):
        make = functools.partial(packed_loader, dataset, 4, rank=rank, world_size=world_size, seed=9)
        reference = make()
        expected = batches(reference, 3 * reference.order.batches_per_epoch + 2)  # crosses epoch boundaries
        first = make()
        batches(first, 5)
        state = first.state_dict()
        resumed = make()
        resumed.load_state_dict(state)
        for want, got in zip(expected[5:], batches(resumed, len(expected) - 5), strict=True):
            assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


@pytest.mark.parametrize(("old", "new"), [(2, 1), (2, 3), (3, 2)])
def test_packed_resharding_continues_the_epoch_without_repeats_or_gaps(corpus, old, new):
    folder, _ = corpus
    dataset = PackedSequences(folder, seq_len=4)
    index_of = {tuple(dataset[i].tolist()): i for i in range(len(dataset))}
    assert len(index_of) == len(dataset), "random data: every window is distinct"
    before = [packed_loader(dataset, 2, rank=r, world_size=old, seed=1) for r in range(old)]
    seen = []
    for _ in range(3):
        for loader in before:
            batch = next(loader)
            seen += [
                index_of[tuple(row)] for row in torch.cat([batch.inputs, batch.targets[:, -1:]], 1).tolist()
            ]
    state = before[0].state_dict()
    after = [packed_loader(dataset, 2, rank=r, world_size=new, seed=1) for r in range(new)]
    for loader in after:
        loader.load_state_dict(state)
    while after[0].order.epoch == 0:
        step = [next(loader) for loader in after]
        if after[0].order.epoch != 0:
            break
        for batch in step:
            seen += [
                index_of[tuple(row)] for row in torch.cat([batch.inputs, batch.targets[:, -1:]], 1).tolist()
            ]
    order = np.random.default_rng([1, 0]).permutation(len(dataset))
    assert seen == order[: len(seen)].tolist()  # the epoch's order, each window once, in order
    assert len(dataset) - len(seen) < 2 * new


def test_resume_with_other_data_or_seed_is_a_clear_error(corpus, tmp_path):
    folder, _ = corpus
    dataset = PackedSequences(folder, seq_len=16)
    loader = packed_loader(dataset, 2, seed=1)
    next(loader)
    state = loader.state_dict()
    with pytest.raises(ValueError, match="seed=1"):
        packed_loader(dataset, 2, seed=2).load_state_dict(state)
    other = tmp_path / "other"
    write_shards(other, [40], np.random.default_rng(7), lambda r: int(r.integers(2, 60)))
    with pytest.raises(ValueError, match="dataset="):
        packed_loader(PackedSequences(other, 16), 2, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="dataset="):
        packed_loader(PackedSequences(folder, 8), 2, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="not a 'token_budget' state"):
        budget_loader(DocumentSequences(folder, 16), 64, pad_id=1, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="not a 'packed' state"):
        loader.load_state_dict({"epoch": 0, "batch_in_epoch": 3, "world_size": 1, "seed": 1})


def test_bad_ranks_and_too_little_data_are_clear_errors(tmp_path, corpus):
    folder, _ = corpus
    with pytest.raises(ValueError, match="rank 2 is not in a data-parallel group of size 2"):
        packed_loader(PackedSequences(folder, 16), 2, rank=2, world_size=2)
    with pytest.raises(ValueError, match="cannot fill one batch"):
        packed_loader(PackedSequences(folder, 16), 1000, world_size=2)
    (tmp_path / "small").mkdir()
    with ShardWriter(tmp_path / "small" / "s", np.dtype(np.uint16)) as writer:
        writer.add_document([1, 2, 3])
    with pytest.raises(ValueError, match="fewer than one sequence"):
        PackedSequences(tmp_path / "small", seq_len=16)
    with pytest.raises(FileNotFoundError, match="no token shards"):
        PackedSequences(tmp_path / "empty", seq_len=16)


def test_truncated_shard_is_a_clear_error(corpus):
    folder, _ = corpus
    victim = folder / "shard-00002-0000.bin"
    victim.write_bytes(victim.read_bytes()[:-2])
    with pytest.raises(ShardFormatError, match="truncated"):
        PackedSequences(folder, seq_len=16)


def test_document_samples_cover_every_prediction_once(corpus):
    folder, documents = corpus
    dataset = DocumentSequences(folder, max_len=10)
    assert (dataset.lengths <= 10).all() and (dataset.lengths >= 1).all()
    pairs = []
    for i in range(len(dataset)):
        sample = dataset[i].tolist()
        assert len(sample) == dataset.lengths[i] + 1
        pairs += list(itertools.pairwise(sample))
    expected = [pair for document in documents for pair in itertools.pairwise(document)]
    assert pairs == expected


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 300), min_size=1, max_size=400),
    st.integers(300, 5000),
    st.integers(1, 500),
    st.integers(0, 1000),
)
def test_token_budget_batches_never_exceed_the_budget_and_cover_each_sample_once(
    lengths, budget, pool_size, seed
):
    lengths = np.array(lengths)
    order = np.random.default_rng(seed).permutation(len(lengths))
    batches = token_budget_batches(lengths, order, budget, pool_size)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) * lengths[batch].max() <= budget


def skewed_corpus(tmp_path):
    """Lengths from a heavy-tailed (log-normal) distribution: many short documents, a few very long ones."""
    rng = np.random.default_rng(11)
    lengths = iter(np.clip(rng.lognormal(4.0, 1.0, size=1500).astype(int), 2, 3000))
    documents = write_shards(tmp_path / "train", [700, 800], rng, lambda r: int(next(lengths)))
    return tmp_path / "train", documents


def test_dynamic_batches_fit_the_budget_and_waste_under_ten_percent_on_skewed_lengths(tmp_path):
    folder, documents = skewed_corpus(tmp_path)
    dataset = DocumentSequences(folder, max_len=512)
    loader = budget_loader(dataset, max_tokens=4096, pad_id=1, seed=4, pool_size=2048)
    padded = real = 0
    targets_seen = []
    for _ in range(loader.order.batches_per_epoch):
        batch = next(loader)
        assert batch.inputs.numel() <= 4096
        mask = batch.targets != IGNORE_INDEX
        assert torch.equal(mask, batch.document_ids != PAD_DOCUMENT)
        assert (batch.inputs[~mask] == 1).all() and (batch.document_ids[mask] == 0).all()
        # Each row is left-aligned: real positions first, then padding.
        assert torch.equal(mask, mask.int().cumprod(1).bool())
        padded += batch.inputs.numel()
        real += int(mask.sum())
        targets_seen.append(int(mask.sum()))
    assert loader.order.epoch == 0
    assert real == sum(len(document) - 1 for document in documents)  # every prediction, once per epoch
    waste = 1 - real / padded
    assert waste < 0.10, f"padding waste {waste:.1%}"


def test_dynamic_batches_are_those_an_independent_reading_of_the_rules_gives(tmp_path):
    """Epoch e: the samples permuted by (seed, e), cut by token_budget_batches, the batches permuted by
    (seed, e, 1); step s gives rank r batch s * world_size + r; an epoch's last incomplete step is skipped."""
    folder, _ = skewed_corpus(tmp_path)
    dataset = DocumentSequences(folder, max_len=256)
    expected = []
    for epoch in range(2):
        order = np.random.default_rng([2, epoch]).permutation(len(dataset))
        cut = token_budget_batches(dataset.lengths, order, 2048, 500)
        shuffle = np.random.default_rng([2, epoch, 1]).permutation(len(cut))
        epoch_batches = [cut[i] for i in shuffle]
        expected += [epoch_batches[: len(epoch_batches) // 3 * 3]]
    loaders = [
        budget_loader(dataset, 2048, pad_id=1, rank=r, world_size=3, seed=2, pool_size=500) for r in range(3)
    ]
    for epoch_batches in expected:
        for step in range(len(epoch_batches) // 3):
            for rank, loader in enumerate(loaders):
                batch = next(loader)
                indices = epoch_batches[step * 3 + rank]
                assert batch.inputs.shape[0] == len(indices)
                for row, index in zip(batch.inputs.tolist(), indices, strict=True):
                    sample = dataset[int(index)].tolist()[:-1]
                    assert row[: len(sample)] == sample and set(row[len(sample) :]) <= {1}


@pytest.mark.parametrize("world_size", [1, 3])
def test_dynamic_resume_mid_epoch_gives_the_identical_batch_sequence(tmp_path, world_size):
    folder, _ = skewed_corpus(tmp_path)
    dataset = DocumentSequences(folder, max_len=256)
    for rank in range(world_size):
        make = functools.partial(
            budget_loader,
            dataset,
            2048,
            pad_id=1,
            rank=rank,
            world_size=world_size,
            seed=2,
            pool_size=500,
        )
        reference = make()
        total = reference.order.batches_per_epoch + 7  # into the second epoch
        expected = batches(reference, total)
        first = make()
        batches(first, 9)
        resumed = make()
        resumed.load_state_dict(first.state_dict())
        for want, got in zip(expected[9:], batches(resumed, total - 9), strict=True):
            assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


def test_dynamic_resharding_continues_with_the_remaining_batches(tmp_path):
    folder, _ = skewed_corpus(tmp_path)
    dataset = DocumentSequences(folder, max_len=256)
    make = lambda rank, world: budget_loader(  # noqa: E731
        dataset, 2048, pad_id=1, rank=rank, world_size=world, seed=2, pool_size=500
    )
    single = make(0, 1)
    expected = batches(single, single.order.batches_per_epoch)
    before = [make(r, 2) for r in range(2)]
    got = []
    for _ in range(4):
        got += [next(loader) for loader in before]
    after = [make(r, 3) for r in range(3)]
    for loader in after:
        loader.load_state_dict(before[1].state_dict())
    while len(got) + 3 <= len(expected):
        got += [next(loader) for loader in after]
    for want, have in zip(expected, got, strict=False):
        assert torch.equal(want.inputs, have.inputs)
    assert len(expected) - len(got) < 3
    with pytest.raises(ValueError, match="max_tokens=2048"):
        budget_loader(dataset, 4096, pad_id=1, seed=2, pool_size=500).load_state_dict(before[0].state_dict())


def test_token_budget_below_max_len_is_a_clear_error(corpus):
    folder, _ = corpus
    with pytest.raises(ValueError, match="below max_len"):
        budget_loader(DocumentSequences(folder, 64), 32, pad_id=1)


def test_the_batching_follows_the_config(corpus, tmp_path):
    folder, _ = corpus
    packed = make_config(tmp_path, "train.seq_len=8", "train.batch_size=2")
    batching = batching_for(packed, pad_id=None)
    loader = TrainLoader.one_snapshot(batching.dataset([folder], 8), batching, rank=1, world_size=2)
    assert loader.kind == "packed" and next(loader).inputs.shape == (2, 8)
    dynamic = make_config(
        tmp_path, "train.seq_len=8", "data.batching=token_budget", "data.max_tokens_per_batch=40"
    )
    batching = batching_for(dynamic, pad_id=1)
    loader = TrainLoader.one_snapshot(batching.dataset([folder], 8), batching)
    assert loader.kind == "token_budget"
    assert all(next(loader).inputs.numel() <= 40 for _ in range(20))
    with pytest.raises(ValueError, match="pad id"):
        batching_for(dynamic, pad_id=None)
