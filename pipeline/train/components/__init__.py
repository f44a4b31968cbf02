"""The parts the trainer composes, torchtitan-style: each one is built from the config, does one job, and
(where it has state) offers ``state_dict()`` / ``load_state_dict()`` for the checkpoint.

- ``optimizer``: AdamW with decay groups, optionally sharded with ZeroRedundancyOptimizer (ZeRO-1);
- ``lr_schedule``: linear warm-up then cosine decay;
- ``amp``: autocast and the fp16 loss scaler, with skipped-step accounting;
- ``checkpoint_manager``: ``CheckpointManager`` over the registered parts (save and resume), per-rank state
  (RNG); the atomic, checksummed files and newest-valid loading are ``pipeline.model.checkpoint``'s;
- ``evaluation``: validation loss over a fixed set of windows, split over the ranks;
- ``metrics``: throughput, MFU, memory and MoE routing figures for ``pipeline.tracking.metric_sinks``.

The data loader is ``pipeline.data.loader.TrainLoader`` (exact ``state_dict`` including resharding).
"""
