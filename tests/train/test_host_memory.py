"""The host allocator tuning: freed step memory stays in the process instead of being faulted back in."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import PROJECT_ROOT

# 64 MiB buffers, above glibc's largest automatic mmap threshold (32 MiB): by default each one is a fresh
# mapping whose pages fault in when written, as activation buffers do every training step.
SCRIPT = textwrap.dedent(
    """
    import resource, sys
    import torch
    from pipeline.train.host_memory import keep_freed_host_memory

    torch.set_num_threads(1)  # one allocating thread, so one malloc arena
    if sys.argv[1] == "kept":
        assert keep_freed_host_memory()
    faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    source = torch.rand(16 * 2**20)
    for _ in range(10):  # the heap settles: small tensors land between the big blocks at first
        (source * 2).sum()
    before = faults()
    for _ in range(10):
        (source * 2).sum()
    print(faults() - before)
    """
)
PAGES_PER_BUFFER = 64 * 2**20 // 4096


def page_faults(mode: str) -> int:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    )
    return int(result.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_kept_host_memory_is_reused_without_page_faults():
    default, kept = page_faults("default"), page_faults("kept")
    assert default > 10 * PAGES_PER_BUFFER // 2, "the default allocator should map fresh pages every time"
    assert kept <= 2 * PAGES_PER_BUFFER, f"{kept} page faults in 10 reuses of a kept 64 MiB buffer"
