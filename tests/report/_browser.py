"""A real headless browser for the page tests: Debian's Chromium, driven over the DevTools
protocol on a pipe (``--remote-debugging-pipe``: JSON messages ended by NUL on fds 3 and 4), so
the tests need nothing from PyPI — no Selenium, no Playwright, no websocket client.

:func:`chromium` finds the browser or returns None (the tests then skip, saying how to install
it: ``apt-get install chromium``). :class:`Browser` opens one page, waits for its load event,
evaluates expressions in it, collects JavaScript errors (uncaught exceptions, ``console.error``,
error log entries) and takes screenshots.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

#: Flags Chromium needs on these machines (closed network, running as root, no GPU).
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--remote-debugging-pipe",
)


def chromium() -> str | None:
    """The browser's path: ``$TENSORARENA_CHROMIUM``, else ``chromium`` on the PATH."""
    for candidate in (os.environ.get("TENSORARENA_CHROMIUM"), "chromium", "chromium-browser"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


class Browser:
    """One headless Chromium with one page; use as a context manager."""

    def __init__(self, executable: str, *, width: int = 1400, height: int = 1000) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="tensorarena-chromium-")
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()

        def wire() -> None:  # in the child: the protocol's fds 3 (commands) and 4 (replies)
            os.dup2(to_browser_read, 3)
            os.dup2(from_browser_write, 4)

        self._process = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={self._profile.name}",
             f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4, to_browser_read, from_browser_write), preexec_fn=wire,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        self.errors: list[str] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self.call("Target.attachToTarget",
                                  {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=True)

    # --- the protocol ------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("the browser did not answer in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("the browser closed the pipe (it exited)")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        message: dict[str, Any] = json.loads(raw)
        if "id" not in message:
            self._note(message)
        return message

    def _note(self, event: dict[str, Any]) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.errors.append(f"uncaught: {details.get('exception', {}).get('description')}"
                               f" ({details.get('text')})")
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append("console.error: " + " ".join(
                str(a.get("value", a.get("description"))) for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            self.errors.append(f"log: {params['entry'].get('text')}")
        self._events.append(event)

    def call(self, method: str, params: dict[str, Any] | None = None, *, session: bool = False,
             timeout: float = 60.0) -> dict[str, Any]:
        """Send one command and return its result (raise on a protocol error)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method,
                                   "params": params or {}}
        if session:
            message["sessionId"] = self._session
        self._send(message)
        deadline = time.monotonic() + timeout
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result

    def wait_for(self, method: str, *, timeout: float = 60.0) -> dict[str, Any]:
        """Wait for the next event ``method`` (events already seen are skipped)."""
        seen = len(self._events)
        deadline = time.monotonic() + timeout
        while True:
            for event in self._events[seen:]:
                if event.get("method") == method:
                    return event
            seen = len(self._events)
            self._receive(deadline)

    # --- what the tests use --------------------------------------------------------------------

    def open(self, path: Path, *, timeout: float = 60.0) -> float:
        """Load ``path`` and wait for its load event; return the seconds it took."""
        start = time.monotonic()
        self.call("Page.navigate", {"url": path.resolve().as_uri()}, session=True)
        self.wait_for("Page.loadEventFired", timeout=timeout)
        return time.monotonic() - start

    def evaluate(self, expression: str, *, timeout: float = 60.0) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, session=True,
                           timeout=timeout)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self) -> bytes:
        """A PNG of the whole page."""
        data = self.call("Page.captureScreenshot", {"format": "png",
                                                    "captureBeyondViewport": True},
                         session=True)["data"]
        return base64.b64decode(data)

    def close(self) -> None:
        """End the browser (and remove its profile)."""
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.call("Browser.close", timeout=10)
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        self._profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
