"""Kubeflow PyTorchJob support: render and validate the manifest, talk to the API, wait in a trigger.

`python -m operators.kubeflow --snapshot S [--set key=value ...]` prints the manifest the Kubernetes
launcher would create, for review or `kubectl apply -f -`.
"""
