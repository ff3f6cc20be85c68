"""``/ui/`` in the service: behind a login, the caller's jobs only, Stop through the API.

The real API (uvicorn subprocess, local launcher, real PyTorch jobs under ``trainguard run``) with
two access keys. Checked over HTTP: no page or data without a session; a key sees its own job and
answers 404 for the other's; a login needs this origin; Stop needs the CSRF token and this
origin; a revoked key's session ends. Checked in Chromium: log in with a key pair, the list shows
the running job, its loss chart grows, and the Stop button stops the job through the API.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.services.conftest import HOOK_EVERY_STEP, api_factory, training_command, wait_for  # noqa: F401
from tests.ui.conftest import save_screenshot

KEYS = {
    "alice": ("AKIDALICEUI000001", "secret-of-alice-ui-0123456"),
    "bob": ("AKIDBOBUI00000001", "secret-of-bob-ui-01234567"),
}


def _keys_text(names: list[str]) -> str:
    return "".join(f"{name}={KEYS[name][0]}:{KEYS[name][1]}\n" for name in names)


@pytest.fixture
def ui_api(api_factory, tmp_path: Path):  # noqa: ANN001, ANN201, F811
    keys_file = tmp_path / "keys"
    keys_file.write_text(_keys_text(["alice", "bob"]))
    os.chmod(keys_file, 0o600)
    api = api_factory(TRAINGUARD_SAGEMAKER_ACCESS_KEYS="", TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE=str(keys_file))
    api.keys_file = keys_file
    return api


def _create(api, owner: str, name: str, steps: int = 3000) -> None:  # noqa: ANN001
    spec = {"name": name, "command": training_command("--steps", str(steps), "--step-seconds", "0.2"),
            "hook_config": HOOK_EVERY_STEP}  # fmt: skip
    status, body = api.signed_request("POST", "/v1/jobs", spec, key_id=KEYS[owner][0], secret=KEYS[owner][1])
    assert status == 201, body


class _Browserless:
    """urllib with a cookie jar: what a browser sends, minus the browser."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()), urllib.request.ProxyHandler({})
        )

    def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any, dict]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", **(headers or {})})  # fmt: skip
        try:
            with self.opener.open(request, timeout=60) as response:
                raw, status, got = response.read(), response.status, dict(response.headers)
        except urllib.error.HTTPError as error:
            raw, status, got = error.read(), error.code, dict(error.headers)
        try:
            return status, json.loads(raw), got
        except ValueError:
            return status, raw.decode(errors="replace"), got

    def login(self, owner: str, origin: str | None = None) -> int:
        body = {"access_key_id": KEYS[owner][0], "secret_access_key": KEYS[owner][1]}
        return self.call("POST", "/ui/api/login", body, {"Origin": origin or self.base})[0]


def test_ui_shows_a_caller_its_own_jobs_only_and_stop_needs_csrf_and_origin(ui_api) -> None:  # noqa: ANN001
    api = ui_api
    _create(api, "alice", "alice-job")
    _create(api, "bob", "bob-job")
    anonymous = _Browserless(api.url)
    assert anonymous.call("GET", "/ui/api/runs")[0] == 401
    status, body, headers = anonymous.call("GET", "/ui/")
    assert status == 200 and "login" in str(body).lower()  # redirected to the login page
    assert "script-src 'self'" in headers["content-security-policy"]

    alice = _Browserless(api.url)
    assert alice.login("alice", origin="http://evil.example") == 403  # a login from another site
    wrong = {"access_key_id": KEYS["alice"][0], "secret_access_key": "wrong-secret-0000000000"}
    assert _Browserless(api.url).call("POST", "/ui/api/login", wrong, {"Origin": api.url})[0] == 401
    assert alice.login("alice") == 200
    rows = wait_for(lambda: alice.call("GET", "/ui/api/runs")[1]["runs"], 120, "alice's job listed")
    assert [row["job"]["name"] for row in rows] == ["alice-job"]
    assert rows[0]["status"] == "running"
    bob = _Browserless(api.url)
    assert bob.login("bob") == 200
    bob_rows = wait_for(lambda: bob.call("GET", "/ui/api/runs")[1]["runs"], 120, "bob's job listed")
    assert [row["job"]["name"] for row in bob_rows] == ["bob-job"]
    bob_id, alice_id = bob_rows[0]["id"], rows[0]["id"]
    for path in (f"/ui/api/runs/{bob_id}", f"/ui/api/runs/{bob_id}/series", f"/ui/api/runs/{bob_id}/logs"):
        assert alice.call("GET", path)[0] == 404, path  # as if it did not exist
    session = alice.call("GET", "/ui/api/session")[1]
    assert "secret" not in json.dumps(session).lower() and session["user"] == "alice"
    csrf = {"X-CSRF-Token": session["csrf"], "Origin": api.url}
    assert alice.call("POST", f"/ui/api/runs/{alice_id}/stop", {}, {"Origin": api.url})[0] == 403  # no token
    assert alice.call("POST", f"/ui/api/runs/{alice_id}/stop", {}, {**csrf, "Origin": "http://evil.example"})[0] == 403
    assert alice.call("POST", f"/ui/api/runs/{bob_id}/stop", {}, csrf)[0] == 404
    assert api.job("bob-job")["status"] == "InProgress" and api.job("alice-job")["status"] == "InProgress"
    status, answer, _ = alice.call("POST", f"/ui/api/runs/{alice_id}/stop", {}, csrf)
    assert status == 202 and answer["stopping"] is True
    wait_for(lambda: api.job("alice-job")["status"] in ("Stopping", "Stopped"), 60, "alice's job stopping")
    assert api.job("bob-job")["status"] == "InProgress"

    api.keys_file.write_text(_keys_text(["alice"]))  # bob's key revoked
    os.chmod(api.keys_file, 0o600)
    wait_for(lambda: bob.call("GET", "/ui/api/runs")[0] == 401, 30, "bob's session ended with his key")
    assert alice.call("GET", "/ui/api/runs")[0] == 200


def test_browser_logs_in_watches_the_job_train_and_stops_it(ui_api, browser, tmp_path: Path) -> None:  # noqa: ANN001
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    api = ui_api
    _create(api, "alice", "watched-job")

    def wait(condition, timeout: float = 180):  # noqa: ANN001, ANN202
        # the page re-renders what it polls: an element found just before a refresh is stale by
        # the time it is read (a loaded CI machine hit it), so the next poll looks again
        ignored = (StaleElementReferenceException,)
        return WebDriverWait(browser, timeout, poll_frequency=0.25, ignored_exceptions=ignored).until(
            lambda d: condition(d)
        )

    browser.delete_all_cookies()
    browser.get(api.url + "/ui/")
    wait(lambda d: d.find_elements(By.ID, "login"))  # not logged in: the login page
    browser.find_element(By.ID, "access_key_id").send_keys(KEYS["alice"][0])
    browser.find_element(By.ID, "secret_access_key").send_keys(KEYS["alice"][1])
    browser.find_element(By.ID, "login-button").click()
    row = wait(lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-status=running]"))[0]
    assert "watched-job" in row.text
    save_screenshot(browser, tmp_path, "ui-service-list")
    browser.get(row.find_element(By.CSS_SELECTOR, "td.name a").get_attribute("href"))

    def points(d) -> int:  # noqa: ANN001
        value = d.execute_script(
            "const n = document.getElementById('chart-losses'); return n ? n.dataset.points : null"
        )
        return int(value) if value else 0

    first = wait(points)
    wait(lambda d: points(d) > first + 3)  # the job trains: the chart grows
    button = wait(lambda d: [b for b in d.find_elements(By.ID, "stop-button") if b.is_displayed()])[0]
    assert api.job("watched-job")["status"] == "InProgress"
    button.click()
    wait(lambda d: "stop requested" in d.find_element(By.ID, "stop-state").text)
    wait_for(lambda: api.job("watched-job")["status"] in ("Stopping", "Stopped"), 60, "the job stopping")
    wait(lambda d: d.find_element(By.CSS_SELECTOR, "#facts .badge").text == "stopped")
    assert "stopped from the dashboard by alice" in api.job("watched-job")["stop_cause"]
    save_screenshot(browser, tmp_path, "ui-service-stopped")


def test_the_one_time_login_url_opens_one_operator_session(tmp_path: Path) -> None:
    """``trainguard serve`` prints ``/ui/login?once=...``: it opens one session, once."""
    from fastapi.testclient import TestClient
    from trainguard.services.api.app import create_app
    from trainguard.services.api.routes_ui import announce_login_token
    from trainguard.services.api.settings import Settings

    token = announce_login_token()
    environ = {"TRAINGUARD_API_TOKEN": "ui-test-token-0123456789", "TRAINGUARD_DATA_DIR": str(tmp_path / "data"),
               "TRAINGUARD_LAUNCHER": "local"}  # fmt: skip
    app = create_app(Settings.from_env(environ))
    with (
        TestClient(app, base_url="http://127.0.0.1:8080") as first,
        TestClient(app, base_url="http://127.0.0.1:8080") as second,
    ):
        assert first.get("/ui/api/session").status_code == 401
        answer = first.get(f"/ui/login?once={token}", follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"] == "/ui/"
        cookie = answer.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
        session = first.get("/ui/api/session").json()
        assert session["user"] == "operator" and session["csrf"]
        again = second.get(f"/ui/login?once={token}", follow_redirects=False)
        assert again.headers["location"] == "/ui/login.html" and "set-cookie" not in again.headers
        assert second.get("/ui/api/session").status_code == 401
