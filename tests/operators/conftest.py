import json

import pytest

from tests.operators.k8s_api_server import ProtocolServer
from tests.operators.kubernetes_tasks import NAMESPACE


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A local server speaking the Kubernetes REST protocol, as the `kubernetes_default` connection."""
    with ProtocolServer() as server:
        kubeconfig = server.kubeconfig(tmp_path / "kubeconfig.yaml", namespace=NAMESPACE)
        connection = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}
        monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(connection))
        yield server
