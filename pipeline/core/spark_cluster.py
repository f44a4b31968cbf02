"""A Spark standalone cluster on this machine: one master and a few workers on 127.0.0.1, from pyspark's jars.

pyspark's wheel has no ``sbin/start-master.sh``, but its ``bin/spark-class`` starts Spark's own
``org.apache.spark.deploy.master.Master`` and ``...deploy.worker.Worker``. Each worker gets its own cores,
memory and work dir, and the whole cluster keeps its scratch space (``SPARK_LOCAL_DIRS``), work dirs and logs
under one folder. The cluster is ready when the master's web UI JSON (``/json/``) lists every worker ALIVE.

The cluster test (``tests/core/test_spark_cluster.py``) and ``make spark-cluster``
(``python -m pipeline.core.spark_cluster``) both start it here. It is for trying a cluster master on one
machine; a production cluster is started by its own deployment (docs/scaling-out.md).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.arguments import ArgumentParser
from pipeline.core.proc import kill_group

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# The master's and workers' own JVM heaps (not the executors'): a few MB of bookkeeping each.
DAEMON_MEMORY = "512m"


class ClusterStartError(RuntimeError):
    """The cluster did not come up; the message ends with the tail of the failing process's log."""


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick), for a process that cannot be asked for port 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def daemon_environment(folder: Path) -> dict[str, str]:
    """The environment of a Spark JVM started here: loopback only, its scratch space and (empty) conf dir
    under ``folder``, and Python workers that run this interpreter and import this checkout's ``pipeline``."""
    return {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(folder / "local"),
        "SPARK_CONF_DIR": str(folder / "conf"),  # empty: no spark-defaults from elsewhere
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        "PYTHONPATH": os.pathsep.join(
            part for part in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if part
        ),
    }


def start_daemon(argv: list[str], env: dict[str, str], folder: Path, log_path: Path) -> subprocess.Popen:
    """Start a long-lived Spark JVM in its own process group, its output appended to ``log_path``."""
    for sub in ("local", "conf"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        # Through pipeline.core.proc: the kernel stops the daemon should this process die, even by SIGKILL.
        command = [sys.executable, "-m", "pipeline.core.proc", str(os.getpid()), str(int(signal.SIGTERM))]
        return subprocess.Popen(
            [*command, *argv],
            env=env,
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: stopping it takes the JVM and every process it forked
        )


@dataclass
class StandaloneCluster:
    """A running master and its workers; ``stop()`` ends them (and the executors they started)."""

    folder: Path
    port: int
    webui_port: int
    workers: int
    processes: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def webui_url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}"

    @property
    def connection_uri(self) -> str:
        """The Airflow connection `pretrain_spark` naming this master (``AIRFLOW_CONN_PRETRAIN_SPARK``)."""
        return self.master_url

    def state(self) -> dict | None:
        """The master's JSON (workers, apps, status), or None while its web UI does not answer yet."""
        try:
            with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=5) as response:
                return json.load(response)
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            return None

    def alive_workers(self) -> int:
        state = self.state() or {}
        return sum(worker.get("state") == "ALIVE" for worker in state.get("workers", []))

    def log(self, name: str) -> Path:
        return self.folder / "logs" / f"{name}.log"

    def start_process(self, name: str, main_class: str, *args: str) -> None:
        env = {
            **daemon_environment(self.folder),
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            # A master whose port was taken since free_port() fails, instead of moving to the next port
            # where nobody would look for it. The master's REST submission server is off: nothing here
            # submits through it, it takes no credentials, and its fixed port 6066 is one a second cluster
            # on the machine (two test suites at once) cannot bind, which left that master in STANDBY,
            # refusing its workers for good.
            "SPARK_DAEMON_JAVA_OPTS": "-Dspark.port.maxRetries=0 -Dspark.master.rest.enabled=false",
        }
        process = start_daemon([str(spark_class()), main_class, *args], env, self.folder, self.log(name))
        self.processes.append((name, process))

    def start(self, cores: int, memory: str, ready_timeout_s: float) -> None:
        for sub in ("local", "conf", "logs"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        self.start_process(
            "master",
            MASTER_CLASS,
            *("--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.webui_port)),
        )
        for index in range(self.workers):
            work_dir = self.folder / f"worker-{index}"
            work_dir.mkdir(exist_ok=True)
            self.start_process(
                f"worker-{index}",
                WORKER_CLASS,
                self.master_url,
                *("--host", "127.0.0.1", "--port", "0", "--webui-port", "0"),
                *("--cores", str(cores), "--memory", memory, "--work-dir", str(work_dir)),
            )
        self.wait_ready(ready_timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        """Wait for the master to list every worker ALIVE; fail at once when a daemon exits instead."""
        end = time.monotonic() + timeout_s
        while self.alive_workers() < self.workers:
            for name, process in self.processes:
                if process.poll() is not None:
                    raise ClusterStartError(
                        f"spark {name} exited with status {process.returncode}:\n{self.log_tail(name)}"
                    )
            if time.monotonic() > end:
                # Every daemon's log: a worker that never turns ALIVE says why in its own log, not the master's.
                logs = "\n".join(
                    f"---- {name} ({self.log(name)}) ----\n{self.log_tail(name)}"
                    for name, _ in self.processes
                )
                raise ClusterStartError(
                    f"{self.alive_workers()} of {self.workers} workers ALIVE at {self.webui_url}/json/ "
                    f"after {timeout_s:.0f} s; master state {json.dumps(self.state())}\n{logs}"
                )
            time.sleep(0.2)

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.log(name)
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        """Workers first (each takes its executors), then the master; safe to call more than once."""
        for _, process in reversed(self.processes):
            kill_group(process, grace_s=15.0)
        self.processes.clear()


@contextlib.contextmanager
def standalone_cluster(
    folder: Path,
    *,
    workers: int = 2,
    cores: int = 1,
    memory: str = "1g",
    ready_timeout_s: float = 300.0,
) -> Iterator[StandaloneCluster]:
    """A master and ``workers`` workers (``cores`` and ``memory`` each) under ``folder``; stopped on exit,
    however the block ends. ``ready_timeout_s`` only bounds a cluster that never comes up."""
    cluster = StandaloneCluster(
        folder=Path(folder), port=free_port(), webui_port=free_port(), workers=workers
    )
    try:
        cluster.start(cores, memory, ready_timeout_s)
        yield cluster
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m pipeline.core.spark_cluster",
        description="Start a Spark standalone master and workers on 127.0.0.1 until Ctrl-C (make spark-cluster).",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--memory", default="1g", help="memory per worker, for its executors")
    parser.add_argument(
        "--folder", type=Path, default=None, help="logs, work dirs, scratch (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    folder = args.folder or Path(tempfile.mkdtemp(prefix="pretrain-spark-cluster-"))

    def stop_on_signal(signum, frame) -> None:
        raise SystemExit(128 + signum)  # unwinds through the context manager, which stops the cluster

    signal.signal(signal.SIGTERM, stop_on_signal)
    signal.signal(signal.SIGHUP, stop_on_signal)
    with standalone_cluster(folder, workers=args.workers, cores=args.cores, memory=args.memory) as cluster:
        atexit.register(cluster.stop)  # also when the interpreter exits some other way
        print(
            f"Spark master {cluster.master_url} with {args.workers} worker(s) "
            f"({args.cores} core(s), {args.memory} each); web UI {cluster.webui_url}\n"
            f"logs and work dirs: {folder}\n"
            f"run a stage on it:  spark-submit --master {cluster.master_url} pipeline/clean/__main__.py "
            "--snapshot s1\n"
            f"or in Airflow:      export AIRFLOW_CONN_PRETRAIN_SPARK={cluster.connection_uri}\n"
            "Ctrl-C stops the cluster.",
            flush=True,
        )
        try:
            while all(process.poll() is None for _, process in cluster.processes):
                time.sleep(1)
        except KeyboardInterrupt:
            return 0
        exited = [name for name, process in cluster.processes if process.poll() is not None]
        print(f"spark {', '.join(exited)} exited; stopping the cluster", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
