"""One MLflow SQLite store for the tracking tests: creating a store runs its migrations, which is slow."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture(scope="session")
def mlflow_store(tmp_path_factory) -> str:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow-store') / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()  # creates the tables once
    return uri


@pytest.fixture
def experiment() -> str:
    """A fresh experiment name, so tests sharing the store never see each other's runs."""
    return f"test-{uuid.uuid4().hex[:12]}"
