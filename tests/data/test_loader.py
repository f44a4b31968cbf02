import numpy as np
import pytest

from pipeline.data.loader import DistributedBatchLoader, PackedSequences
from pipeline.tokenization.shards import ShardWriter


@pytest.fixture
def shard_folder(tmp_path):
    rng = np.random.default_rng(1)
    for shard in range(2):
        with ShardWriter(tmp_path / f"shard-{shard:05d}", np.dtype(np.uint16)) as writer:
            for _ in range(30):
                writer.add_document(rng.integers(0, 1000, size=rng.integers(5, 60)))
    return tmp_path


def test_windows_overlap_by_one_token_for_targets(shard_folder):
    dataset = PackedSequences(shard_folder, seq_len=16)
    assert np.array_equal(dataset[0][-1:], dataset[1][:1])
    assert len(dataset) == (len(dataset.stream) - 1) // 16


def test_ranks_see_disjoint_sequences_covering_the_epoch(shard_folder):
    dataset = PackedSequences(shard_folder, seq_len=16)
    seen = []
    for rank in range(2):
        loader = DistributedBatchLoader(dataset, batch_size=4, rank=rank, world_size=2, seed=3)
        for _ in range(loader.batches_per_epoch):
            inputs, targets = next(loader)
            assert inputs.shape == targets.shape == (4, 16)
            assert np.array_equal(inputs[:, 1:], targets[:, :-1])
            seen += [tuple(row.tolist()) for row in inputs]
    assert len(seen) == len(set(seen)) == loader.batches_per_epoch * 8


def test_resume_gives_the_identical_batch_sequence(shard_folder):
    dataset = PackedSequences(shard_folder, seq_len=16)
    reference = DistributedBatchLoader(dataset, batch_size=4, seed=9)
    expected = [next(reference)[0].clone() for _ in range(25)]  # crosses epoch boundaries
    first = DistributedBatchLoader(dataset, batch_size=4, seed=9)
    for _ in range(11):
        next(first)
    resumed = DistributedBatchLoader(dataset, batch_size=4, seed=9)
    resumed.load_state_dict(first.state_dict())
    assert all(np.array_equal(next(resumed)[0], batch) for batch in expected[11:])


def test_changed_world_size_is_a_clear_error(shard_folder):
    dataset = PackedSequences(shard_folder, seq_len=16)
    state = DistributedBatchLoader(dataset, batch_size=2, world_size=2).state_dict()
    with pytest.raises(ValueError, match="data-parallel size 2"):
        DistributedBatchLoader(dataset, batch_size=2, world_size=1).load_state_dict(state)


def test_too_little_data_is_a_clear_error(tmp_path):
    with ShardWriter(tmp_path / "s", np.dtype(np.uint16)) as writer:
        writer.add_document([1, 2, 3])
    with pytest.raises(ValueError, match="fewer than one sequence"):
        PackedSequences(tmp_path, seq_len=16)
    with pytest.raises(FileNotFoundError, match="no token shards"):
        PackedSequences(tmp_path / "empty", seq_len=16)
