"""The report stage: completes a training run in MLflow (metrics, plots, samples, model) and registers it.

The stage itself is ``mlflow_report`` (with ``hf_generator``, the registered model's pyfunc); the MLflow
runs it completes, and their helpers, are ``pipeline.tracking.mlflow_runs``.
"""
