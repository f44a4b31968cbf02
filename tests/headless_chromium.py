"""Headless Chromium for tests, driven over the DevTools protocol on a pipe.

`--remote-debugging-pipe` makes Chromium read protocol commands on fd 3 and write answers and events on fd 4,
each one JSON message ended by a NUL byte: no port, no websocket, no driver process and no Python dependency.
The browser is the pinned one `scripts/fetch_chromium.py` puts in .chromium/.

    with HeadlessChromium(executable) as browser:
        page = browser.open(Path("report.html").as_uri())
        page.evaluate("document.title")
        png = page.screenshot()
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless",
    "--no-sandbox",  # the sandbox needs user namespaces or a setuid helper; tests open local files only
    "--disable-gpu",
    "--disable-dev-shm-usage",  # containers have a small /dev/shm
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--mute-audio",
]
NO_ANSWER_S = 300.0  # only stops a hung browser; every wait below is on a message from it


class BrowserError(RuntimeError):
    pass


class HeadlessChromium:
    def __init__(
        self, executable: Path, env: dict[str, str] | None = None, width: int = 1280, height: int = 900
    ):
        self.executable, self.width, self.height = executable, width, height
        self.env = {**os.environ, **(env or {})}
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict[str, Any]] = []

    def __enter__(self) -> HeadlessChromium:
        self.profile = Path(tempfile.mkdtemp(prefix="chromium-profile-"))
        self.log = self.profile.parent / f"{self.profile.name}.log"
        commands_read, self._commands = os.pipe()
        self._answers, answers_write = os.pipe()

        def on_fds_3_and_4() -> None:  # in the child, before exec
            read, write = os.dup(commands_read), os.dup(answers_write)  # above 4, so dup2 cannot clobber
            os.dup2(read, 3)
            os.dup2(write, 4)

        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [
                    str(self.executable),
                    "--remote-debugging-pipe",
                    f"--user-data-dir={self.profile}",
                    f"--window-size={self.width},{self.height}",
                    *FLAGS,
                    "about:blank",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self.env,
                close_fds=False,
                preexec_fn=on_fds_3_and_4,
            )
        os.close(commands_read)
        os.close(answers_write)
        try:
            self.version = self.call("Browser.getVersion")["product"]
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            if self.process.poll() is None:
                self.call("Browser.close")
                self.process.wait(timeout=60)
        except (BrowserError, OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        finally:
            os.close(self._commands)
            os.close(self._answers)
            shutil.rmtree(self.profile, ignore_errors=True)
            self.log.unlink(missing_ok=True)

    def log_tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    # --- the protocol -------------------------------------------------------------------------------

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict:
        """Send one command and return its result; events that arrive meanwhile are kept for wait_event."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        try:
            os.write(self._commands, json.dumps(message).encode() + b"\0")
        except BrokenPipeError as error:
            raise BrowserError(f"Chromium has exited ({self.process.poll()}):\n{self.log_tail()}") from error
        answer = self._receive(lambda m: m.get("id") == message["id"], method)
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def wait_event(self, method: str, session: str | None = None) -> dict:
        """The first event ``method`` (of ``session``) not yet waited for, waiting for it if need be."""
        for index, event in enumerate(self._events):
            if event["method"] == method and event.get("sessionId") == session:
                return self._events.pop(index)
        event = self._receive(lambda m: m.get("method") == method and m.get("sessionId") == session, method)
        return event

    def _receive(self, wanted, what: str) -> dict:
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                message = json.loads(raw)
                if wanted(message):
                    return message
                if "method" in message:
                    self._events.append(message)
            ready, _, _ = select.select([self._answers], [], [], NO_ANSWER_S)
            if not ready:
                raise BrowserError(
                    f"no answer from Chromium to {what} in {NO_ANSWER_S:.0f} s:\n{self.log_tail()}"
                )
            chunk = os.read(self._answers, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium closed its pipe ({self.process.poll()}):\n{self.log_tail()}")
            self._buffer += chunk

    def open(self, url: str) -> Page:
        """A new tab showing ``url``, once its load event fired (every image in the page has loaded or failed)."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        page.call("Page.enable")
        page.call("Runtime.enable")
        self._events = [event for event in self._events if event.get("sessionId") != session]
        navigated = page.call("Page.navigate", {"url": url})
        if navigated.get("errorText"):
            raise BrowserError(f"cannot open {url}: {navigated['errorText']}")
        self.wait_event("Page.loadEventFired", session)
        return page


class Page:
    def __init__(self, browser: HeadlessChromium, session: str) -> None:
        self.browser, self.session = browser, session

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict:
        return self.browser.call(method, params, self.session)

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression (awaited when it is a promise)."""
        answer = self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in answer:
            raise BrowserError(f"{expression!r} threw: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def screenshot(self) -> bytes:
        """A PNG of the whole page, not only the window's part of it."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.call(
            "Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True}
        )
        return base64.b64decode(shot["data"])
