"""Kubeflow jobs for the Kubernetes launcher: render and validate the manifest, talk to the API, wait in a trigger.

Two APIs (the kubernetes setting ``api``, ``api.py``): Kubeflow Trainer v2 ``TrainJob`` (``trainjob.py``, the
default) and the legacy training-operator's ``PyTorchJob`` (``manifest.py``, which also holds the settings
and the pod parts both share).

`python -m operators.kubeflow --snapshot S [--set key=value ...]` prints the manifest the Kubernetes
launcher would create, for review or `kubectl apply -f -`.
"""
