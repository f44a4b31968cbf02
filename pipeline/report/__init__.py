"""The report stage: completes a training run in MLflow (metrics, plots, samples, model) and registers it.

The MLflow machinery lives in ``pipeline.tracking``; this package is the stage's entrypoint.
"""
