"""Serve a folder over HTTP on 127.0.0.1 for as long as a crawl needs it (the bundled sample site)."""

from __future__ import annotations

import contextlib
import functools
import html
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path


def sample_site() -> contextlib.AbstractContextManager[Path]:
    """The bundled sample site (package data) as a folder on disk for as long as the block runs."""
    return resources.as_file(resources.files("pipeline.crawl") / "sample_site")


class _QuietHandler(SimpleHTTPRequestHandler):
    """Static files, plus a /sitemap.xml listing every .html file (sitemaps need absolute URLs)."""

    def log_message(self, format: str, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/sitemap.xml":
            return super().do_GET()
        root = Path(self.directory)
        base = f"http://{self.headers.get('Host') or '127.0.0.1'}"
        locs = "".join(
            f"<url><loc>{html.escape(base + '/' + page.relative_to(root).as_posix())}</loc></url>"
            for page in sorted(root.rglob("*.html"))
        )
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{locs}</urlset>'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # socketserver's default of 5 drops SYNs when a crawler opens many connections


@contextlib.contextmanager
def serve_folder(folder: Path | None = None, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Yield the base URL (``http://127.0.0.1:<port>``) of a static server for ``folder`` (default: the bundled
    sample site)."""
    if folder is None:
        with sample_site() as site, serve_folder(site, host, port) as url:
            yield url
        return
    if not folder.is_dir():
        raise FileNotFoundError(f"cannot serve {folder}: not a folder")
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = _Server((host, port), handler)
    thread = threading.Thread(target=server.serve_forever, name="site-server", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
