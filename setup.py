"""Builds the cuda_ext._C extension; package metadata stays in setup.cfg.

What gets compiled (docs/cuda_ext.md explains the choice):

* always: the pybind11 module with the CPU routing kernels (g++, a few seconds);
* the CUDA kernels (nvcc, sm_80 + sm_90 SASS and compute_90 PTX) when nvcc is found, GPU or not, so the
  CUDA sources and their link into the module are checked on every build (about 15 CPU-seconds).
  ``PRETRAIN_BUILD_CUDA=0`` forces a CPU-only build; ``PRETRAIN_BUILD_CUDA=1`` fails if nvcc is missing.
  ``PRETRAIN_CUDA_ARCHS="90"`` narrows the architectures (default ``"80;90"``).

Works with ``pip install --no-build-isolation -e .`` (pybind11 must then be installed) and offline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

try:
    from pybind11.setup_helpers import ParallelCompile, Pybind11Extension
except ImportError:  # pragma: no cover - only without pybind11
    sys.exit(
        "cuda_ext needs pybind11 to build: `pip install pybind11` first "
        "(with --no-build-isolation the build uses the current environment)."
    )

CSRC = "cuda_ext/csrc"  # relative: setuptools wants source paths relative to this file
CUDA_SOURCES = [f"{CSRC}/routing_cuda.cu", f"{CSRC}/gemm_cuda.cu"]
CPU_SOURCES = [f"{CSRC}/bindings.cpp", f"{CSRC}/routing_cpu.cpp"]


def find_nvcc() -> Path | None:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var) and (Path(os.environ[var]) / "bin" / "nvcc").is_file():
            return Path(os.environ[var]) / "bin" / "nvcc"
    found = shutil.which("nvcc")
    if found:
        return Path(found).resolve()
    default = Path("/usr/local/cuda/bin/nvcc")
    return default if default.is_file() else None


def build_cuda_wanted(nvcc: Path | None) -> bool:
    flag = os.environ.get("PRETRAIN_BUILD_CUDA", "auto").strip().lower()
    if flag in ("0", "false", "no", "off"):
        return False
    if flag in ("1", "true", "yes", "on"):
        if nvcc is None:
            sys.exit("PRETRAIN_BUILD_CUDA=1 but nvcc was not found: set CUDA_HOME or put nvcc on PATH.")
        return True
    return nvcc is not None


def gencode_flags() -> list[str]:
    archs = [a.strip() for a in os.environ.get("PRETRAIN_CUDA_ARCHS", "80;90").replace(",", ";").split(";")]
    archs = sorted({a for a in archs if a}, key=int)
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    # PTX of the newest architecture lets newer GPUs JIT-compile the kernels.
    return [*flags, f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}"]


def cuda_home_of(nvcc: Path) -> Path:
    """The toolkit folder of nvcc, which may be a wrapper script elsewhere (asks nvcc where it lives)."""
    try:
        dry = subprocess.run(
            [str(nvcc), "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
        )
        for line in (dry.stdout + dry.stderr).splitlines():
            if line.startswith("#$ _HERE_="):
                return Path(line.split("=", 1)[1].strip()).parent
    except (OSError, subprocess.SubprocessError):
        pass
    return nvcc.parent.parent


def cudart_link(cuda_home: Path) -> tuple[list[str], list[str]]:
    """Library dirs and libraries for the CUDA runtime: static when available (no libcudart at run time)."""
    candidates = [cuda_home / "lib64", cuda_home / "lib", *sorted(cuda_home.glob("targets/*/lib"))]
    for folder in candidates:
        if (folder / "libcudart_static.a").is_file():
            return [str(folder)], ["cudart_static", "dl", "rt", "pthread"]
    for folder in candidates:
        if any(folder.glob("libcudart.so*")):
            return [str(folder)], ["cudart"]
    sys.exit(f"nvcc found in {cuda_home}, but no CUDA runtime library next to it.")


class BuildExt(build_ext):
    """Compiles the .cu sources with nvcc (in parallel), then links them into the pybind11 module."""

    def build_extensions(self) -> None:
        # Always rebuild: setuptools' timestamp check would keep a CPU-only module after PRETRAIN_BUILD_CUDA
        # changes, and the whole build takes seconds.
        self.force = True
        for ext in self.extensions:
            cuda_sources = getattr(ext, "cuda_sources", [])
            if cuda_sources:
                ext.extra_objects = [*ext.extra_objects, *self._nvcc_compile(ext, cuda_sources)]
        super().build_extensions()

    def _nvcc_compile(self, ext, sources: list[str]) -> list[str]:
        out_dir = Path(self.build_temp) / "cuda"
        out_dir.mkdir(parents=True, exist_ok=True)
        flags = [
            "-O3",
            "-std=c++17",
            "-DNDEBUG",
            "-lineinfo",
            *gencode_flags(),
            "-Xcompiler",
            "-fPIC",
            "-Xcompiler",
            "-fvisibility=hidden",
            *(f"-I{d}" for d in ext.include_dirs),
        ]

        def compile_one(source: str) -> str:
            obj = out_dir / (Path(source).stem + ".o")
            cmd = [str(ext.nvcc), "-c", source, "-o", str(obj), *flags]
            print(" ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)
            return str(obj)

        with ThreadPoolExecutor(max_workers=max(1, min(len(sources), os.cpu_count() or 1))) as pool:
            return list(pool.map(compile_one, sources))


BUILD_INFO = "pipeline/core/build_info.json"  # read by pipeline.core.lineage.code_version outside a checkout


def git_revision() -> str | None:
    """The checkout's commit (with -dirty when tracked files changed), or None outside git."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


class BuildPy(build_py):
    """Records the git revision the package was built from in the built package (never in the source tree),
    so an installed wheel still names its code in every manifest."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads git from its checkout
            return
        target = Path(self.build_lib) / BUILD_INFO
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps({"git_revision": git_revision()}) + "\n")


def extension() -> Pybind11Extension:
    nvcc = find_nvcc()
    with_cuda = build_cuda_wanted(nvcc)
    print(
        f"cuda_ext: building {'CPU + CUDA' if with_cuda else 'CPU-only'} kernels (nvcc: {nvcc})", flush=True
    )
    ext = Pybind11Extension(
        "cuda_ext._C",
        CPU_SOURCES,
        include_dirs=[CSRC],
        extra_compile_args=["-O3"],
        cxx_std=17,
    )
    if with_cuda:
        cuda_home = cuda_home_of(nvcc)
        library_dirs, libraries = cudart_link(cuda_home)
        ext.define_macros.append(("PRETRAIN_WITH_CUDA", "1"))
        ext.library_dirs += library_dirs
        ext.libraries += libraries
        ext.cuda_sources = CUDA_SOURCES
        ext.nvcc = nvcc
    ext.depends = sorted(str(p) for p in Path(CSRC).glob("*") if p.suffix in {".h", ".cuh", ".cu", ".cpp"})
    return ext


ParallelCompile("PRETRAIN_BUILD_JOBS").install()
setup(ext_modules=[extension()], cmdclass={"build_ext": BuildExt, "build_py": BuildPy})
