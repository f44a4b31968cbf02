"""Train on everything a corpus has: every complete snapshot of it, each time a new one is tokenized.

The scheduled variant of `pretrain`: on each `token_shards` event it trains one run on the mixture
``[{corpus: <the form's corpus, else the event's>, snapshots: all}]``, so the newest snapshot joins the ones
before it (a mixture filled in on the form replaces it). The run is filed under the event's snapshot. Created
paused: unpause it, or `pretrain` (one snapshot per event), or both. The form is `pretrain`'s, plus the
corpus: both Airflow DAGs are built by ``operators.training.training_dag``.
"""

from __future__ import annotations

from operators.training import training_dag

pretrain_every_snapshot = training_dag(
    "pretrain_every_snapshot",
    doc_md=__doc__,
    tags=["pretrain", "train", "mixture"],
    every_snapshot=True,
    is_paused_upon_creation=True,
)
