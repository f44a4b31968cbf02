"""Training data: memory-mapped token shards served as packed, rank-sharded, resumable batches."""
