"""The negative control of test_fsdp's Muon test, loaded by every rank through PYTHONPATH: torch's Muon made to
orthogonalise each rank's row-slice of a matrix alone (the wrong Muon under FSDP), not the whole matrix."""

from __future__ import annotations

import sys

import torch.optim._muon as muon
from torch.distributed.tensor import DTensor

_whole = muon._zeropower_via_newtonschulz


def _shard_wise(grad, *args):
    if isinstance(grad, DTensor):
        rows = _whole(grad.to_local(), *args)
        return DTensor.from_local(
            rows, grad.device_mesh, grad.placements, shape=grad.shape, stride=grad.stride()
        )
    return _whole(grad, *args)


muon._zeropower_via_newtonschulz = _shard_wise
print("muon: shard-wise orthogonalisation", file=sys.stderr)
