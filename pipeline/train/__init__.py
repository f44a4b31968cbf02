"""Distributed training: the torchrun entrypoint, the trainer and the components it composes.

Whose process runs what: ``launcher`` runs in `pretrain train` (or an Airflow task) and the torchrun agent;
``distributed``, ``components`` and ``trainer`` run in each rank; ``fault_injection`` (chaos tests only) is
set by the launcher and fires in a rank.
"""
