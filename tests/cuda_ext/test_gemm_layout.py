"""The mma.sync GEMM kernel's index maps (csrc/gemm_layout.h: cp.async copies, ldmatrix addresses, C staging)
against the PTX ISA's fragment layouts and for bank conflicts, by a host program (gemm_layout_check.cpp) built
with the C++ compiler: what can be checked of the kernel's data movement without a GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CXX = shutil.which("c++") or shutil.which("g++")


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
def test_mma_kernel_index_maps_match_the_ptx_fragment_layouts(tmp_path):
    binary = tmp_path / "gemm_layout_check"
    source = Path(__file__).with_name("gemm_layout_check.cpp")
    cmd = [CXX, "-std=c++17", "-O1", "-Wall", "-Werror", f"-I{ROOT / 'cuda_ext' / 'csrc'}", str(source)]
    built = subprocess.run([*cmd, "-o", str(binary)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout
