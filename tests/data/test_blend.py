"""The loader's mixture order: shares by weight, one order for any number of ranks, exact resume, repeated sources."""

from __future__ import annotations

import functools
import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.data.batching import Packed, TokenBudget
from pipeline.data.blend import BLEND_PERIOD, blending_schedule
from pipeline.data.loader import TrainLoader
from pipeline.data.sequences import IGNORE_INDEX, DocumentSequences, PackedSequences
from tests.data.test_loader import write_shards

ID_RANGE = 1000  # source i writes token ids in [i * 1000 + 1, i * 1000 + 999]; 0 is end-of-text


def write_source(folder, index, documents_per_shard, lengths, seed):
    """Documents whose ids all lie in source ``index``'s own range, so a row names its source by its ids."""
    rng = np.random.default_rng(seed)
    documents = write_shards(folder, documents_per_shard, rng, lengths)
    offset = index * ID_RANGE
    for prefix in sorted(folder.glob("*.bin")):
        tokens = np.fromfile(prefix, dtype=np.uint16)
        tokens[tokens != 0] += offset
        tokens.tofile(prefix)
    return [[t + offset if t else 0 for t in document] for document in documents]


def owner_of(row: torch.Tensor) -> int:
    """The source whose id range every non-EOS token of the row lies in (asserting there is one)."""
    ids = row[row > 0]
    owners = set((ids // ID_RANGE).tolist())
    assert len(owners) == 1, f"a row mixes sources {owners}"
    return owners.pop()


@pytest.fixture
def three_sources(tmp_path):
    """Three sources of very different sizes: large, medium and small (the small one is repeated)."""
    specs = [([60, 40], 60), ([30], 40), ([3], 20)]
    folders = []
    for index, (counts, longest) in enumerate(specs):
        folder = tmp_path / f"source{index}" / "train"
        write_source(
            folder, index, counts, lambda r, longest=longest: int(r.integers(2, longest)), seed=index
        )
        folders.append(folder)
    return folders


def packed_loader(folders, weights=(0.5, 0.3, 0.2), batch_size=4, seq_len=8, **kwargs):
    datasets = [PackedSequences(folder, seq_len) for folder in folders]
    names = [f"s{i}" for i in range(len(folders))]
    return TrainLoader.mixture(names, datasets, weights, Packed(batch_size), **kwargs)


def budget_loader(names, datasets, weights, max_tokens, pad_id, pool_size=16_384, **kwargs):
    return TrainLoader.mixture(names, datasets, weights, TokenBudget(max_tokens, pad_id, pool_size), **kwargs)


def plain_megatron_schedule(weights, size):
    """Megatron's rule written out plainly: per sample, every source's error, then the first largest."""
    total = sum(weights)
    counts = [0] * len(weights)
    chosen = []
    for k in range(size):
        errors = [w / total * max(k, 1) - c for w, c in zip(weights, counts, strict=True)]
        source = errors.index(max(errors))
        chosen.append(source)
        counts[source] += 1
    return chosen


@pytest.mark.parametrize("weights", [(0.5, 0.3, 0.2), (1, 1), (0.7, 0.2, 0.05, 0.05), (3, 1e-3)])
def test_the_schedule_is_megatrons_rule(weights):
    assert blending_schedule(tuple(weights), 5000).tolist() == plain_megatron_schedule(weights, 5000)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.01, 1.0), min_size=1, max_size=6), st.integers(1, 3000))
def test_every_prefix_of_the_schedule_is_within_two_samples_of_each_share(weights, prefix):
    """Megatron's rule keeps every source close to its share at every point (1.25 samples at most measured
    on 300 random weight sets; two is the bound the module states)."""
    schedule = blending_schedule(tuple(weights), 3000)[:prefix]
    shares = np.array(weights) / sum(weights)
    counts = np.bincount(schedule, minlength=len(weights))
    assert np.all(np.abs(counts - shares * prefix) <= 2)


def test_packed_token_shares_match_the_weights_and_rows_come_from_their_source(three_sources):
    """Over N rows each source's share of the tokens is within 2/N + 2/P of its weight (module doc)."""
    loader = packed_loader(three_sources, batch_size=8)
    tokens = np.zeros(3)
    rows = 0
    for _ in range(1500):
        batch = next(loader)
        assert batch.sources.shape == (8,)
        for row, source in zip(batch.inputs, batch.sources.tolist(), strict=True):
            assert owner_of(row) == source
        tokens += np.bincount(batch.sources.numpy(), weights=[8] * 8, minlength=3)
        rows += 8
    shares = tokens / tokens.sum()
    assert np.all(np.abs(shares - [0.5, 0.3, 0.2]) <= 2 / rows + 2 / BLEND_PERIOD), shares
    # The small source (3 documents) gave far more than it holds: it was repeated, and counted as such.
    epochs = loader.order.source_epochs()
    assert epochs["s2"] > 10 and epochs["s0"] < epochs["s2"]
    assert loader.order.source_samples() == {f"s{i}": int(tokens[i] // 8) for i in range(3)}


def test_packed_rows_are_the_windows_an_independent_reading_of_the_rules_gives(three_sources):
    """Row k of the blend (counted over all ranks) comes from Megatron's source i for k; it is the j-th row
    source i gives, so window j mod n_i of its epoch j div n_i, ordered by a permutation seeded (seed, i, epoch)."""
    weights, seed = (0.5, 0.3, 0.2), 5
    datasets = [PackedSequences(folder, 8) for folder in three_sources]
    given = [0, 0, 0]
    expected = []
    for source in plain_megatron_schedule(weights, 400):
        size, drawn = len(datasets[source]), given[source]
        given[source] += 1
        window = np.random.default_rng([seed, source, drawn // size]).permutation(size)[drawn % size]
        expected.append((source, datasets[source][int(window)].tolist()))
    assert given[2] > 2 * len(datasets[2])  # the small source is repeated
    loader = packed_loader(three_sources, weights, batch_size=4, seed=seed)
    got = []
    for _ in range(100):
        batch = next(loader)
        rows = torch.cat([batch.inputs, batch.targets[:, -1:]], 1)
        got += list(zip(batch.sources.tolist(), rows.tolist(), strict=True))
    assert got == expected


def test_token_budget_token_shares_match_the_weights(tmp_path):
    """Batches of one source hold different numbers of tokens; the blend weighs sources by their mean tokens
    per batch, so token shares come within half a percent of the weights over a few thousand batches (0.02% off
    measured on five seeds; the sources' lengths differ by 10x)."""
    short = tmp_path / "short" / "train"
    long = tmp_path / "long" / "train"
    write_source(short, 0, [400], lambda r: int(r.integers(2, 12)), seed=1)
    write_source(long, 1, [300], lambda r: int(r.integers(20, 120)), seed=2)
    datasets = [DocumentSequences(short, 64), DocumentSequences(long, 64)]
    loader = budget_loader(["short", "long"], datasets, [0.25, 0.75], 256, pad_id=7, seed=3)
    tokens = np.zeros(2)
    for _ in range(3000):
        batch = next(loader)
        assert batch.inputs.numel() <= 256
        (source,) = set(batch.sources.tolist())
        real = batch.targets != IGNORE_INDEX  # padding (pad id 7) belongs to no source
        assert all(owner_of(row[mask]) == source for row, mask in zip(batch.inputs, real, strict=True))
        tokens[source] += int((batch.targets != IGNORE_INDEX).sum())
    shares = tokens / tokens.sum()
    assert np.all(np.abs(shares - [0.25, 0.75]) <= 0.005), shares


def rows_of(batches):
    return torch.cat([batch.inputs for batch in batches]), torch.cat([batch.sources for batch in batches])


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_order_is_the_same_for_any_number_of_ranks_and_every_run(three_sources, world_size):
    single = packed_loader(three_sources, batch_size=2, seed=5)
    expected = rows_of([next(single) for _ in range(world_size * 40)])
    again = packed_loader(three_sources, batch_size=2, seed=5)
    assert torch.equal(rows_of([next(again) for _ in range(world_size * 40)])[0], expected[0])
    ranks = [
        packed_loader(three_sources, batch_size=2, seed=5, rank=r, world_size=world_size)
        for r in range(world_size)
    ]
    got = rows_of([next(loader) for _ in range(40) for loader in ranks])  # step by step, rank by rank
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    other_seed = packed_loader(three_sources, batch_size=2, seed=6)
    assert not torch.equal(rows_of([next(other_seed) for _ in range(world_size * 40)])[0], expected[0])


def checkpointed(state):
    """A state through torch.save/torch.load, as a checkpoint carries it."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("world_size", [1, 2])
def test_packed_resume_gives_exactly_the_batches_of_an_uninterrupted_run(three_sources, world_size):
    for rank in range(world_size):
        make = functools.partial(packed_loader, three_sources, seed=9, rank=rank, world_size=world_size)
        expected = [next(reference) for reference in [make()] for _ in range(60)]
        first = make()
        for _ in range(23):
            next(first)
        resumed = make()
        resumed.load_state_dict(checkpointed(first.state_dict()))
        for want, got in zip(expected[23:], [next(resumed) for _ in range(37)], strict=True):
            assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
            assert torch.equal(want.sources, got.sources)


@pytest.mark.parametrize(("old", "new"), [(2, 1), (2, 3), (3, 2)])
def test_resume_at_another_data_parallel_size_continues_the_same_sequence(three_sources, old, new):
    single = packed_loader(three_sources, batch_size=2, seed=4)
    expected = rows_of([next(single) for _ in range(old * 5 + new * 8)])
    before = [packed_loader(three_sources, batch_size=2, seed=4, rank=r, world_size=old) for r in range(old)]
    got = [next(loader) for _ in range(5) for loader in before]
    state = checkpointed(before[old - 1].state_dict())
    after = [packed_loader(three_sources, batch_size=2, seed=4, rank=r, world_size=new) for r in range(new)]
    for loader in after:
        loader.load_state_dict(state)
    got += [next(loader) for _ in range(8) for loader in after]
    rows, sources = rows_of(got)
    assert torch.equal(rows, expected[0]) and torch.equal(sources, expected[1])


def test_token_budget_resume_and_resharding(tmp_path):
    folders = []
    for index in range(2):
        folder = tmp_path / f"s{index}" / "train"
        write_source(folder, index, [80], lambda r: int(r.integers(2, 50)), seed=index + 10)
        folders.append(folder)

    def make(rank=0, world=1):
        datasets = [DocumentSequences(folder, 32) for folder in folders]
        return budget_loader(
            ["a", "b"], datasets, [2, 1], 128, pad_id=1, rank=rank, world_size=world, seed=2, pool_size=30
        )

    single = make()
    expected = [next(single) for _ in range(7 * 2 + 15 * 3)]
    before = [make(r, 2) for r in range(2)]
    got = [next(loader) for _ in range(7) for loader in before]
    after = [make(r, 3) for r in range(3)]
    for loader in after:
        loader.load_state_dict(checkpointed(before[0].state_dict()))
    got += [next(loader) for _ in range(15) for loader in after]
    for want, have in zip(expected, got, strict=True):
        assert torch.equal(want.inputs, have.inputs) and torch.equal(want.sources, have.sources)


def test_a_one_document_source_is_repeated_with_its_epochs_counted(tmp_path):
    one = tmp_path / "one" / "train"
    (document,) = write_source(one, 0, [1], lambda r: 17, seed=0)  # 17 tokens: 4 windows of 4 + 1
    big = tmp_path / "big" / "train"
    write_source(big, 1, [50], lambda r: int(r.integers(5, 40)), seed=1)
    loader = packed_loader([one, big], weights=(1, 3), batch_size=4, seq_len=4)
    windows = {tuple(document[i * 4 : i * 4 + 5]) for i in range(4)}
    seen = []
    for _ in range(100):
        batch = next(loader)
        rows = torch.cat([batch.inputs, batch.targets[:, -1:]], 1)
        seen += [
            tuple(row.tolist())
            for row, source in zip(rows, batch.sources.tolist(), strict=True)
            if source == 0
        ]
    assert len(seen) == 100  # a quarter of 400 rows
    # Every pass over the source shows each of its 4 windows once, in a fresh order.
    passes = [seen[i : i + 4] for i in range(0, 100, 4)]
    assert all(set(p) == windows for p in passes)
    assert len({tuple(p) for p in passes}) > 1
    assert loader.order.source_epochs()["s0"] == 25.0
    assert loader.state_dict()["source_epochs"]["s0"] == 25.0

    datasets = [DocumentSequences(one, 32), DocumentSequences(big, 32)]
    budget = budget_loader(["one", "big"], datasets, [1, 1], 64, pad_id=1, seed=0)
    draws = sum(int(next(budget).sources[0] == 0) for _ in range(200))
    assert budget.order.source_epochs()["one"] == budget.order.source_samples()["one"] == draws > 1


def test_a_checkpoint_of_another_mixture_is_refused_naming_the_difference(three_sources):
    loader = packed_loader(three_sources, seed=1)
    next(loader)
    state = loader.state_dict()
    with pytest.raises(ValueError, match="seed=1"):
        packed_loader(three_sources, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="weights="):
        packed_loader(three_sources, weights=(0.4, 0.4, 0.2), seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="sources="):
        packed_loader(three_sources[:2], weights=(0.5, 0.5), seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="datasets="):
        packed_loader(three_sources, seq_len=6, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="not a 'blended_packed' state"):
        loader.load_state_dict({"kind": "packed", "version": 1, "epoch": 0, "position": 3})


def test_bad_mixtures_are_clear_errors(three_sources):
    with pytest.raises(ValueError, match="positive"):
        packed_loader(three_sources, weights=(1, 0, 1))
    with pytest.raises(ValueError, match="rank 3"):
        packed_loader(three_sources, rank=3, world_size=2)


def test_shares_hold_over_any_window_of_the_run(three_sources):
    """Not only on average: any run of consecutive batches is within a couple of rows of the weights."""
    loader = packed_loader(three_sources, batch_size=16)
    for _ in range(6):
        counts = sum(np.bincount(next(loader).sources.numpy(), minlength=3) for _ in range(50))
        assert np.all(np.abs(counts - np.array([0.5, 0.3, 0.2]) * counts.sum()) <= 2)
