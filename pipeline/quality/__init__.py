"""Data-quality report: embeddings, domain coverage and diversity of a cleaned corpus."""
