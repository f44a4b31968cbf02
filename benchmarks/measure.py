"""Measure a command as a whole: its wall time, the CPU seconds of its process tree, and the peak resident
memory of each kind of process in it (the driver, Spark's JVM, Python workers). Shared by the benchmarks that
run stages as commands (benchmarks/dedup.py, benchmarks/scale.py)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_S = 0.2


def peak_resident_mb(pid: int) -> float:
    """VmHWM, the process's resident peak so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_measured(command: list[str], log_path: Path, env: dict | None = None) -> dict:
    """Run ``command`` (output to ``log_path``); SystemExit with the log's tail when it fails. The last CPU
    sample of a process that ends is up to SAMPLE_S old."""
    import psutil

    peaks: dict[int, tuple[str, float]] = {}
    cpu: dict[int, float] = {}
    with log_path.open("w") as log:
        started = time.monotonic()
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        root = psutil.Process(process.pid)

        def sample() -> None:
            try:
                family = [root, *root.children(recursive=True)]
            except psutil.Error:
                return
            for proc in family:
                try:
                    kind = (
                        "driver" if proc.pid == root.pid else ("jvm" if "java" in proc.name() else "worker")
                    )
                    times = proc.cpu_times()
                except psutil.Error:
                    continue
                cpu[proc.pid] = max(cpu.get(proc.pid, 0.0), times.user + times.system)
                peaks[proc.pid] = (kind, max(peaks.get(proc.pid, (kind, 0.0))[1], peak_resident_mb(proc.pid)))

        def watch() -> None:
            while process.poll() is None:
                sample()
                time.sleep(SAMPLE_S)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        code = process.wait()
        wall = time.monotonic() - started
        watcher.join()
    if code != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-30:]
        raise SystemExit(
            f"{' '.join(command[:4])} failed with exit status {code} (log: {log_path}):\n" + "\n".join(tail)
        )
    by_kind: dict[str, float] = {}
    for kind, peak in peaks.values():
        by_kind[kind] = max(by_kind.get(kind, 0.0), peak)
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(sum(cpu.values()), 1),
        "peak_mb": {k: round(v, 1) for k, v in sorted(by_kind.items())},
    }


def launch_workers(
    script: str, out: Path, processes: int, config_path: Path, variants: Any, steps: int, timeout_s: float
) -> Any:
    """Run ``script --worker OUT CONFIG VARIANTS --steps N`` as ``processes`` ranks (torchrun --standalone above
    one; one thread each; the script's ``--worker`` calls ``worker``) and return the JSON its rank 0 wrote to
    ``out``. Shared by the benchmarks that time
    the trainer over several ranks (benchmarks/pipeline_parallel.py, benchmarks/train_scale.py)."""
    import json
    import os
    import sys

    worker = [script, "--worker", str(out), str(config_path), json.dumps(variants), "--steps", str(steps)]
    command = [sys.executable, *worker]
    if processes > 1:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={processes}",
        ]
        command += worker
    subprocess.run(
        command,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
        timeout=timeout_s,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
    )
    return json.loads(out.read_text())


def worker(
    out: Path, config_path: Path, variants: list, steps: int, measure: Callable[[Any, int], dict]
) -> None:
    """One process of a ``launch_workers`` launch: each ``[name, overrides]`` variant a Trainer of its own, in
    order, in one process group, measured by ``measure(config, steps)`` (every rank calls it); rank 0 writes
    ``[[name, figures], ...]`` to ``out``."""
    import json
    import os

    import torch.distributed as dist

    from pipeline.config import load_config

    results = []
    for index, (name, overrides) in enumerate(variants):
        config = load_config(config_path, [*overrides, f"train.run_id={name}-{index}", "train.resume=false"])
        results.append([name, measure(config, steps)])
    if int(os.environ.get("RANK", "0")) == 0:
        out.write_text(json.dumps(results))
    if dist.is_initialized():
        dist.destroy_process_group()
