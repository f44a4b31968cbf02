"""Serve a folder over HTTP on 127.0.0.1 for as long as a crawl needs it."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SAMPLE_SITE = Path(__file__).resolve().parent / "sample_site"


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:
        pass


@contextlib.contextmanager
def serve_folder(folder: Path = SAMPLE_SITE, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Yield the base URL (``http://127.0.0.1:<port>``) of a static server for ``folder``."""
    if not folder.is_dir():
        raise FileNotFoundError(f"cannot serve {folder}: not a folder")
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="site-server", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
