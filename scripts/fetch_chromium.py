"""Fetch a pinned headless Chromium into .chromium/ (git-ignored), for the tests that open pages in a browser.

    python scripts/fetch_chromium.py            # or: make chromium
    python scripts/fetch_chromium.py --tarball chromium-147.0.0.tgz   # offline, from a copy of the tarball

No Chromium package is installed on the development machines and Playwright's browser download needs the
internet, but the npm registry is reachable: `@sparticuz/chromium` ships a self-contained
chrome-headless-shell for Linux x86-64 (brotli-compressed, with the NSS libraries it links and a few fonts).
The tarball is checked against the sha512 integrity the npm registry published for that version before
anything is unpacked. The browser lands in .chromium/<version>/, complete or not at all.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import os
import platform
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FOLDER = PROJECT_ROOT / ".chromium"
VERSION = "147.0.0"  # @sparticuz/chromium; Chromium 147.0.7727
TARBALL_URL = f"https://registry.npmjs.org/@sparticuz/chromium/-/chromium-{VERSION}.tgz"
# dist.integrity of that version in the registry's metadata (`npm view @sparticuz/chromium@147.0.0 dist.integrity`)
INTEGRITY = "sha512-4ZKeAQQa8up2mt675qSitztLdbQrlf8BKdC5naeap+5Mv1OV1OlJdPoU+EJC/p5sQUJUQmN4r+q5+EhaaOUHpQ=="
COMPLETE = ".complete"
FONTS_CONF = """<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "fonts.dtd">
<fontconfig>
  <include ignore_missing="yes">/etc/fonts/fonts.conf</include>
  <dir>{fonts}</dir>
  <cachedir>{cache}</cachedir>
</fontconfig>
"""


class ChromiumUnavailable(RuntimeError):
    """Chromium is not here and could not be fetched (no network, wrong platform, bad download)."""


def browser_folder(folder: Path = DEFAULT_FOLDER) -> Path:
    return folder / VERSION


def executable(folder: Path = DEFAULT_FOLDER) -> Path | None:
    """The fetched browser's executable, or None when it has not been fetched (completely)."""
    home = browser_folder(folder)
    return home / "chromium" if (home / COMPLETE).exists() else None


def environment(chromium: Path) -> dict[str, str]:
    """The variables the bundled browser needs: its NSS libraries, and fonts (the system's plus its own)."""
    home = chromium.parent
    library_path = os.pathsep.join(
        part for part in (str(home / "lib"), os.environ.get("LD_LIBRARY_PATH", "")) if part
    )
    return {"LD_LIBRARY_PATH": library_path, "FONTCONFIG_FILE": str(home / "fonts.conf")}


def _download(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            return response.read()
    except OSError as error:  # URLError, timeouts, resets
        raise ChromiumUnavailable(f"could not download {url}: {error}") from error


def _check_integrity(data: bytes, integrity: str = INTEGRITY) -> None:
    algorithm, _, expected = integrity.partition("-")
    actual = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
    if actual != expected:
        raise ChromiumUnavailable(f"the tarball's {algorithm} is {actual}, the registry published {expected}")


def _unbrotli(data: bytes) -> bytes:
    import brotli

    return brotli.decompress(data)


def fetch(folder: Path = DEFAULT_FOLDER, tarball: Path | None = None) -> Path:
    """The browser's executable, downloading and unpacking the pinned version first if needed."""
    found = executable(folder)
    if found:
        return found
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise ChromiumUnavailable(
            f"the pinned Chromium is built for Linux x86-64, not {sys.platform} {platform.machine()}"
        )
    data = tarball.read_bytes() if tarball else _download(TARBALL_URL)
    _check_integrity(data)
    home = browser_folder(folder)
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{VERSION}-", dir=folder))
    staging.chmod(0o755)  # mkdtemp makes it private
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as package:

            def member(name: str) -> bytes:
                return _unbrotli(package.extractfile(f"package/bin/{name}").read())

            (staging / "chromium").write_bytes(member("chromium.br"))
            (staging / "chromium").chmod(0o755)
            for bundle, into in (("al2023.tar.br", staging), ("fonts.tar.br", staging / "fonts-bundle")):
                with tarfile.open(fileobj=io.BytesIO(member(bundle))) as inner:
                    inner.extractall(into, filter="data")  # al2023: lib/*.so (NSS); fonts: fonts/*/*.ttf
        (staging / "fonts.conf").write_text(
            FONTS_CONF.format(fonts=home / "fonts-bundle" / "fonts", cache=home / "fonts-cache")
        )
        (staging / COMPLETE).write_text(TARBALL_URL + "\n")
        shutil.rmtree(home, ignore_errors=True)  # an incomplete earlier attempt
        staging.rename(home)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return home / "chromium"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--folder", type=Path, default=DEFAULT_FOLDER, help="where to put it (default .chromium/)"
    )
    parser.add_argument("--tarball", type=Path, help=f"a local copy of {TARBALL_URL}, instead of downloading")
    args = parser.parse_args(argv)
    try:
        print(fetch(args.folder, args.tarball))
    except ChromiumUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
