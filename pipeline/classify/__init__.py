"""Learned quality filtering: train a classifier (``training``), score every document with any number of
models and keep a threshold or a top fraction (``job``). docs/filtering.md."""
