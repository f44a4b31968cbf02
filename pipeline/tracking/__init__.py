"""Tracking: MLflow runs and lineage, log shipping and live metrics."""
