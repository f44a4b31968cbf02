"""A warm Spark: a long-lived Spark Connect server on this machine, from pyspark's own jars.

Every Spark stage started as its own process pays for a JVM and a SparkContext (5-8 s) before its first job.
A Spark Connect server pays that once; a stage then attaches in about 2 s (``spark.remote``, or
``SPARK_REMOTE``: see ``pipeline.core.spark``). pyspark's wheel ships ``spark-connect_2.13``, so
``bin/spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer spark-internal`` starts one.

``pretrain spark-server`` / ``make spark-server`` (``main``) and the test fixture (``connect_server``) start
it here, bound to 127.0.0.1 by default: the server runs whatever Python its clients send, so it must not
listen where others can reach it. The server is ready when its gRPC port accepts connections.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from pipeline.core.arguments import ArgumentParser
from pipeline.core.config import ENV_PREFIX, CoreConfig, load_tree
from pipeline.core.proc import kill_group
from pipeline.core.spark import session_settings
from pipeline.core.spark_cluster import ClusterStartError, daemon_environment, free_port, start_daemon

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002  # Spark Connect's own default


class ConnectStartError(ClusterStartError):
    """The server did not come up; the message ends with the tail of its log."""


def spark_submit() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-submit"


def server_settings(config: CoreConfig) -> dict[str, str]:
    """What the server's JVM starts with: the stages' own settings (``pipeline.core.spark``), the config's
    master, no web UI, and the driver on the loopback interface."""
    return {
        **session_settings(False, config),
        "spark.master": config.spark.master,
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
    }


@dataclass
class ConnectServer:
    """A running Spark Connect server; ``stop()`` ends it and its Python workers."""

    folder: Path
    host: str
    port: int
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"sc://{self.host}:{self.port}"

    @property
    def log(self) -> Path:
        return self.folder / "logs" / "spark-connect.log"

    def log_tail(self, lines: int = 30) -> str:
        path = self.log
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def start(self, config: CoreConfig, ready_timeout_s: float) -> None:
        self.launch(config)
        self.wait_ready(ready_timeout_s)

    def launch(self, config: CoreConfig) -> None:
        """Start the server's process without waiting for it (``wait_ready`` does): its JVM's seconds can
        pass while the caller does other work."""
        log4j = resources.files("pipeline.core") / "log4j2.properties"
        settings = {
            **server_settings(config),
            "spark.connect.grpc.binding.address": self.host,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log4j}",
        }
        argv = [str(spark_submit()), "--class", SERVER_CLASS, "--driver-memory", config.spark.driver_memory]
        for key, value in settings.items():
            argv += ["--conf", f"{key}={value}"]
        self.process = start_daemon(
            [*argv, "spark-internal"], daemon_environment(self.folder), self.folder, self.log
        )

    def accepting(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def wait_ready(self, timeout_s: float) -> None:
        """Wait for the gRPC port to accept; fail at once when the server exits instead."""
        assert self.process is not None
        end = time.monotonic() + timeout_s
        while not self.accepting():
            if self.process.poll() is not None:
                raise ConnectStartError(
                    f"the Spark Connect server exited with status {self.process.returncode}:\n{self.log_tail()}"
                )
            if time.monotonic() > end:
                raise ConnectStartError(
                    f"the Spark Connect server did not accept on {self.url} after {timeout_s:.0f} s "
                    f"({self.log}):\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        """Safe to call more than once."""
        if self.process is not None:
            kill_group(self.process, grace_s=15.0)
            self.process = None


@contextlib.contextmanager
def connect_server(
    folder: Path,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    config: CoreConfig | None = None,
    ready_timeout_s: float = 180.0,
) -> Iterator[ConnectServer]:
    """A Spark Connect server (logs and scratch space under ``folder``) with ``config``'s spark section
    (master, driver memory, extra_conf), stopped on exit however the block ends. ``port=None`` takes a free
    one; ``ready_timeout_s`` only bounds a server that never comes up."""
    server = ConnectServer(folder=Path(folder), host=host, port=free_port() if port is None else port)
    try:
        server.start(config or CoreConfig(), ready_timeout_s)
        yield server
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="pretrain spark-server",
        description="Start a Spark Connect server until Ctrl-C, for Spark stages to attach to instead of "
        "starting a JVM each (make spark-server).",
        epilog="example: pretrain spark-server --port 15002, then in another shell "
        "SPARK_REMOTE=sc://127.0.0.1:15002 pretrain clean --snapshot s1",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="gRPC port (default %(default)s; 0: a free one)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a spark.* setting for the server: spark.master (default local[2]), spark.driver_memory, "
        "spark.extra_conf (PRETRAIN__SPARK__* too)",
    )
    parser.add_argument(
        "--folder", type=Path, default=None, help="logs and scratch space (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    # Only the spark section: the server runs no stage, and this module reads no stage's config.
    environ = {key: value for key, value in os.environ.items() if key.startswith(f"{ENV_PREFIX}SPARK__")}
    config = load_tree(CoreConfig, None, args.overrides, environ)
    folder = args.folder or Path(tempfile.mkdtemp(prefix="pretrain-spark-connect-"))

    def stop_on_signal(signum, frame) -> None:
        raise SystemExit(128 + signum)  # unwinds through the context manager, which stops the server

    signal.signal(signal.SIGTERM, stop_on_signal)
    signal.signal(signal.SIGHUP, stop_on_signal)
    port = args.port or None
    with connect_server(folder, host=args.host, port=port, config=config) as server:
        atexit.register(server.stop)  # also when the interpreter exits some other way
        print(
            f"Spark Connect server {server.url} (master {config.spark.master}); log {server.log}\n"
            f"attach the stages to it:  export SPARK_REMOTE={server.url}\n"
            f"  or in the config:       spark.remote: {server.url}  (--set spark.remote={server.url})\n"
            "Ctrl-C stops the server.",
            flush=True,
        )
        try:
            while server.process is not None and server.process.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            return 0
        print(f"the Spark Connect server exited; its log: {server.log}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
