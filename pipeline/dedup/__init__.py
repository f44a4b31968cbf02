"""Deduplication: exact (content hash) and near-duplicate (MinHash LSH) removal in Spark."""
