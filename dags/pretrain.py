"""Train a model on a corpus snapshot: triggered by new token shards, or from the Airflow UI with a form.

Scheduled on the `token_shards` Asset, so each snapshot a corpus DAG publishes is trained on with the config
it was built with. Triggered by hand, the form (declared once, ``operators.training.TRAINING_FORM``) sets the
model preset, steps, nodes, processes per node, launcher (torchrun here, or a Kubeflow TrainJob or PyTorchJob
on Kubernetes), precision, parallelism and MLflow experiment; empty fields keep the config's values, and an
empty snapshot means the newest tokenized one. Built, as `pretrain_every_snapshot` is, by
``operators.training.training_dag``.
"""

from __future__ import annotations

from operators.training import training_dag

pretrain = training_dag("pretrain", doc_md=__doc__, tags=["pretrain", "train"])
