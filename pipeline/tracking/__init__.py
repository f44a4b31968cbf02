"""Tracking: MLflow runs and lineage (``mlflow_runs``) and the metric sinks of a training (``metric_sinks``:
metrics.jsonl, MLflow, TensorBoard, Prometheus, ECS lines). The report stage is ``pipeline.report``."""
