"""Tokenizer training and Spark tokenization into packed token shards."""
