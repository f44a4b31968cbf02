"""The `tracking` config section: MLflow runs and registry, samples, TensorBoard and Prometheus."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.core.config import Section


class TrackingConfig(Section):
    mlflow_tracking_uri: str | None = Field(
        None, description="default: $MLFLOW_TRACKING_URI, else a SQLite store under the data root"
    )
    experiment: str | None = Field(None, description="default: pretrain-<corpus>-<model preset>")
    stage_runs: bool = Field(True, description="record every stage execution as a nested MLflow run")
    required: bool = Field(
        False, description="fail a stage when recording it in MLflow fails (default: log an error, go on)"
    )
    register_model: bool = Field(True, description="register the trained model in the MLflow Model Registry")
    registered_model: str | None = Field(
        None, description="Model Registry name; default: pretrain-<corpus>-<model preset>"
    )
    checkpoint_artifact: Literal["weights", "pointer"] = Field(
        "weights", description="log the final weights as an artifact, or only a pointer to the checkpoint"
    )
    sample_prompts: list[str] = Field(
        default_factory=lambda: ["The", "Bees", "In the garden"],
        description="prompts for the sample generations logged with a trained model",
    )
    sample_tokens: int = Field(32, ge=0, description="greedy tokens per sample generation; 0 disables")
    prometheus_port: int | None = Field(
        None, ge=0, le=65535, description="trainer /metrics port; each local rank serves port + local rank"
    )
    prometheus_addr: str = "0.0.0.0"
    tensorboard: bool = Field(
        True, description="trainer writes TensorBoard events under <train output>/tensorboard"
    )
