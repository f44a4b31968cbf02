"""Benchmark decontamination: documents sharing a word n-gram with an evaluation set are dropped or cut."""
