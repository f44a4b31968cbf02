"""The rank's distributed pieces: code that runs inside each training rank (a torchrun worker process).

- ``process_groups``: torch.distributed set-up from the config (the main group and the gloo control group),
  DDP wrapping;
- ``parallelism``: the ``Parallelism`` component the trainer composes, and ``DataParallelism`` (DDP / ZeRO-1);
- ``pipeline_parallel``: ``PipelineParallelism``, the model cut by layers over the "pp" dimension of a
  ("pp", "dp") mesh and run by ``torch.distributed.pipelining`` schedules;
- ``compression``: gradient compression as DDP communication hooks.

The launcher (``pipeline.train.launcher``) never imports this package: it runs before torch.distributed does.
"""
