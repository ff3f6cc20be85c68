"""Headless Chromium for the report tests, driven through chromedriver's WebDriver HTTP API.

No selenium: the few WebDriver calls the tests need are plain JSON over HTTP (urllib). The
performance log (Chrome DevTools ``Network.*`` events) tells which URLs the page requested.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
_TIMEOUT_S = 30.0


def find_chromium() -> tuple[str | None, str | None]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    return browser, shutil.which("chromedriver")


def screenshot(browser: str, url: str, target: Path, *, width: int = 1400, height: int = 6000) -> None:
    """The page as PNG, through the browser's own ``--screenshot`` flag."""
    with tempfile.TemporaryDirectory(prefix="tg-chromium-") as profile:
        command = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                   "--hide-scrollbars", f"--screenshot={target}", url]  # fmt: skip
        completed = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if completed.returncode != 0 or not target.exists():
        raise RuntimeError(f"chromium --screenshot failed ({completed.returncode}): {completed.stderr[-2000:]}")


class WebDriver:
    """One chromedriver process and one browser session; use as a context manager."""

    def __init__(self, browser: str, driver: str) -> None:
        self.browser, self.driver = browser, driver
        self.profile = tempfile.TemporaryDirectory(prefix="tg-chromium-")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.process = subprocess.Popen(
            [driver, f"--port={self.port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.base = f"http://127.0.0.1:{self.port}"
        self.session = ""

    def __enter__(self) -> WebDriver:
        deadline = time.monotonic() + _TIMEOUT_S
        while True:
            try:
                if self._call("GET", "/status")["ready"]:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.close()
                raise RuntimeError(f"chromedriver did not start on port {self.port}")
            time.sleep(0.1)
        capabilities = {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": self.browser,
                "args": [*CHROMIUM_FLAGS, f"--user-data-dir={self.profile.name}", "--window-size=1400,1000"],
            },
            "goog:loggingPrefs": {"performance": "ALL"},
        }
        self.session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": capabilities}})["sessionId"]
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.session:
            try:
                self._call("DELETE", f"/session/{self.session}")
            except (urllib.error.URLError, ConnectionError, RuntimeError):
                pass
            self.session = ""
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.profile.cleanup()

    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
                return json.loads(response.read())["value"]
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"WebDriver {method} {path}: {error.code} {error.read()[:1000]!r}") from None

    def open(self, url: str) -> None:
        self._call("POST", f"/session/{self.session}/url", {"url": url})

    def run_script(self, script: str) -> Any:
        """Run ``script`` (a function body that returns a JSON-able value) in the page."""
        return self._call("POST", f"/session/{self.session}/execute/sync", {"script": script, "args": []})

    def run_async_script(self, script: str, *args: Any) -> Any:
        """Run ``script``; it ends by calling ``arguments[arguments.length - 1](result)``."""
        return self._call("POST", f"/session/{self.session}/execute/async", {"script": script, "args": list(args)})

    def image_statistics(self, png: Path) -> dict[str, Any]:
        """Size, distinct colours and share of near-white pixels of a PNG, decoded by the browser.

        The image goes in as a data: URL (which does not taint a canvas), so no image library is
        needed on the Python side.
        """
        self.open("about:blank")
        script = """
            const done = arguments[arguments.length - 1];
            const image = new Image();
            image.onerror = () => done({error: 'not an image'});
            image.onload = () => {
                const canvas = document.createElement('canvas');
                canvas.width = image.naturalWidth; canvas.height = image.naturalHeight;
                const context = canvas.getContext('2d');
                context.drawImage(image, 0, 0);
                const pixels = context.getImageData(0, 0, canvas.width, canvas.height).data;
                const colours = new Set();
                let light = 0;
                for (let i = 0; i < pixels.length; i += 4) {
                    colours.add((pixels[i] << 16) | (pixels[i + 1] << 8) | pixels[i + 2]);
                    if (pixels[i] > 245 && pixels[i + 1] > 245 && pixels[i + 2] > 245) light++;
                }
                done({width: canvas.width, height: canvas.height, colours: colours.size,
                      near_white_share: light / (pixels.length / 4)});
            };
            image.src = 'data:image/png;base64,' + arguments[0];
        """
        self._call("POST", f"/session/{self.session}/timeouts", {"script": int(_TIMEOUT_S * 1000)})
        return self.run_async_script(script, base64.b64encode(png.read_bytes()).decode())

    def requested_urls(self) -> list[str]:
        """Every URL the page asked for since the session started (DevTools Network events)."""
        entries = self._call("POST", f"/session/{self.session}/se/log", {"type": "performance"})
        urls = []
        for entry in entries:
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                urls.append(message["params"]["request"]["url"])
            elif message["method"] == "Network.webSocketCreated":
                urls.append(message["params"]["url"])
        return urls
