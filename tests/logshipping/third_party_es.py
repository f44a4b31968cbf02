"""An Elasticsearch-compatible server someone else wrote, for the log shipper's tests: noida-db (PyPI,
pinned in the dev extra), which answers as Elasticsearch 8.15.3 on 127.0.0.1.

What it covers of what the shipper uses: ``_bulk`` with ``create`` (per-item results, 201, 409
``version_conflict_engine_exception`` on a re-sent id, 400 ``document_parsing_exception`` for a value
the mapping refuses), ``_index_template`` (GET, PUT; its mappings applied to new indices), ``_refresh``,
``_search``, ``_count`` and index deletion, all with the ``X-Elastic-Product`` header the client insists
on. What it does not: ILM (``_ilm/policy``) and data streams (``_data_stream``, and the ``@timestamp``
they require); those stay covered by the protocol tests only (``es_protocol.FakeElasticsearch``), and the
shipper runs against noida-db with ``logging.elasticsearch_setup=template``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from importlib.resources import files
from pathlib import Path

SETUP = "template"  # logging.elasticsearch_setup for this server: no ILM, no data streams


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class NoidaElasticsearch:
    """noida-db's Elasticsearch service alone, on a free 127.0.0.1 port and a private data folder; stopped
    (its whole process group) when the block ends, however it ends."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.folder = Path(tempfile.mkdtemp(prefix="noida-db-"))
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> NoidaElasticsearch:
        binary = Path(str(files("noida_db").joinpath("noida-db")))
        binary.chmod(0o755)
        self.log = open(self.folder / "server.log", "wb")  # closed in __exit__
        command = [str(binary), "start", "--only", "elasticsearch", "--host", "127.0.0.1"]
        command += ["--elasticsearch-port", str(self.port), "--data-dir", str(self.folder / "data")]
        self.process = subprocess.Popen(
            command,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_ready(self) -> None:
        """Until the server answers GET / (the signal it is up), or its process has exited."""
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"noida-db exited {self.process.returncode}: {self.log_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/", timeout=5) as response:
                    if response.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                time.sleep(0.1)

    def log_text(self) -> str:
        return (self.folder / "server.log").read_text(errors="replace")

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()
