"""The launcher's process pieces: code that runs in `pretrain train` (or an Airflow task) and in the torchrun
agent it starts, above the ranks.

- ``launch``: build the torchrun command, start it, wait, publish the run;
- ``agent``: torchrun's own main as the launcher runs it (``python -m pipeline.train.launcher.agent``);
- ``runs``: which run folder a training writes (decided once, here) and its ``run.json``;
- ``failures``: how a training ends when it does not finish, and which failures no restart can fix (the
  ranks record them, the launcher reads them).

Process groups and parallelism are the ranks' (``pipeline.train.distributed``). ``launch``, ``runs`` and
``failures`` import no torch: the launcher imports them before torchrun starts.
"""
