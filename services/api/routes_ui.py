"""The dashboard at ``/ui/`` (pages of :mod:`trainguard.ui`, data of its views) for the service's jobs.

Who sees what is the native API's rule: a caller lists and opens exactly the jobs
``JobService.list_jobs`` / ``job_for`` give it (a job it may not describe is a 404 like a missing
one), reads a job's logs only as ``GET /v1/jobs/{name}/logs`` would, and stops one only where the
tenancy policy lets it stop. Browsers cannot sign with SigV4, so a caller logs in once (an access
key pair, the API token, or ``trainguard serve``'s one-time login URL) and gets a session cookie
(:mod:`.ui_sessions`). Stop is a POST carrying the session's CSRF token in a header, from this
origin only. Pages and static files carry no job data and no secret; every answer here sends the
dashboard's Content-Security-Policy.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from trainguard.services.api.jobs import JobForbidden, JobNotFound, JobService
from trainguard.services.api.planner import tensors_location
from trainguard.services.api.schemas import JobSpec
from trainguard.services.api.ui_sessions import SESSION_COOKIE, SESSION_SECONDS, UiSession, UiSessions

from trainguard.ui.discover import RunLocation
from trainguard.ui.live import LiveRun
from trainguard.ui.server import PAGES, security_headers, static_file
from trainguard.ui.views import dumps

__all__ = ["announce_login_token", "mount_ui"]

_STATUS = {
    "InProgress": "running",
    "Completed": "completed",
    "Failed": "failed",
    "Stopping": "stopped",
    "Stopped": "stopped",
}
_DESCRIBE_EVERY_S = 2.0
_LOG_LINES = 300
_announced: list[str] = []  # one-time login tokens made by `trainguard serve` before the app exists


def announce_login_token() -> str:
    """A one-time login token the next app built in this process accepts (``serve`` prints its URL)."""
    import secrets

    token = secrets.token_urlsafe(32)
    _announced.append(token)
    return token


def _json(status: int, document: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(document), status_code=status, media_type="application/json",
                    headers={**security_headers(), "Cache-Control": "no-store", **(headers or {})})  # fmt: skip


class _Jobs:
    """The service's side of the dashboard: job -> run location, descriptions cached briefly."""

    def __init__(self, service: JobService) -> None:
        self.service = service
        self.settings = service.settings
        self._locations: dict[str, RunLocation] = {}  # job name -> where its tensors are (fixed per job)
        self._described: dict[str, tuple[float, dict[str, Any]]] = {}
        self.open_runs: OrderedDict[str, LiveRun] = OrderedDict()
        self.lock = threading.Lock()

    def location(self, name: str, launcher: str, spec: dict[str, Any]) -> RunLocation:
        found = self._locations.get(name)
        if found is None:
            url = tensors_location(self.settings, JobSpec.model_validate(spec), launcher)
            options = (
                {"endpoint_url": self.settings.s3_endpoint_url}
                if url.startswith("s3://") and self.settings.s3_endpoint_url
                else {}
            )
            found = self._locations[name] = RunLocation(url, options)
        return found

    def describe(self, name: str, caller: Any) -> dict[str, Any]:
        """The native description (authorised for ``caller`` every time; the document cached 2 s)."""
        self.service.job_for(caller, name)  # JobNotFound for a caller who may not see it
        cached = self._described.get(name)
        if cached is None or time.monotonic() - cached[0] > _DESCRIBE_EVERY_S:
            cached = self._described[name] = (time.monotonic(), self.service.describe(name))
        return cached[1]


class _CallerRuns:
    """A RunSource of the jobs one caller may see."""

    def __init__(self, jobs: _Jobs, caller: Any) -> None:
        self.jobs, self.caller = jobs, caller
        self.by_id: dict[str, str] = {}  # run id -> job name

    def locations(self) -> tuple[list[RunLocation], list[str]]:
        found, problems = [], []
        for row in self.jobs.service.list_jobs(caller=self.caller):
            try:
                job = self.jobs.service.job_for(self.caller, row.name)
                location = self.jobs.location(job.name, job.launcher, job.spec)
            except (JobNotFound, ValueError) as error:
                problems.append(f"{row.name}: {error}")
                continue
            self.by_id[location.id] = job.name
            found.append(location)
        return found, problems

    def extra(self, run: LiveRun) -> dict[str, Any]:
        name = self.by_id.get(run.location.id, "")
        description = self.jobs.describe(name, self.caller)
        run.rules_from_store = False
        run.rules.set_results(
            [{k: v for k, v in rule.items() if k != "advice"} for rule in description.get("rules") or ()]
        )
        status = description.get("status") or ""
        can_stop = status == "InProgress" and self.jobs.settings.tenancy.allows(
            self.caller, "stop", description.get("owner")
        )
        text = (
            description.get("stop_cause")
            or description.get("failure_reason")
            or description.get("secondary_status")
            or status
        )
        return {
            "path": f"job {name}",  # the server's own directories are none of the caller's business
            "status": _STATUS.get(status, run.status()[0]),
            "status_text": str(text),
            "job": {
                "name": name,
                "status": status,
                "status_details": description.get("secondary_status"),
                "stop_cause": description.get("stop_cause"),
                "owner": description.get("owner"),
                "can_stop": can_stop,
            },
        }


def _dashboard(request: Request, session: UiSession) -> tuple[Any, _CallerRuns]:
    from trainguard.ui.dashboard import Dashboard

    jobs: _Jobs = request.app.state.ui_jobs
    source = _CallerRuns(jobs, session.caller)
    return Dashboard(source, extra=source.extra, open_runs=jobs.open_runs, lock=jobs.lock), source


def _same_origin(request: Request) -> bool:
    """A state-changing request must come from a page of this origin (CSRF, with the token)."""
    origin = request.headers.get("origin") or request.headers.get("referer") or ""
    parsed = urlsplit(origin)
    return bool(parsed.netloc) and parsed.netloc == request.headers.get("host", "")


def mount_ui(app: FastAPI) -> None:
    """Add ``/ui/`` to the service's app (sessions in ``app.state.ui_sessions``)."""
    sessions = UiSessions(app.state.settings)
    for token in _announced:
        sessions._once[token] = time.time() + 600
    _announced.clear()
    app.state.ui_sessions = sessions
    app.state.ui_jobs = _Jobs(app.state.service)
    router = APIRouter(prefix="/ui", include_in_schema=False)

    def session_of(request: Request) -> UiSession | None:
        return sessions.get(request.cookies.get(SESSION_COOKIE))

    def with_cookie(response: Response, request: Request, token: str) -> Response:
        response.set_cookie(SESSION_COOKIE, token, max_age=SESSION_SECONDS, path="/ui", httponly=True,
                            samesite="strict", secure=request.url.scheme == "https")  # fmt: skip
        return response

    @router.get("")
    def root() -> Response:
        return RedirectResponse("/ui/", status_code=307)

    @router.get("/static/{path:path}")
    def static(path: str) -> Response:
        found = static_file(path)
        if found is None:
            return _json(404, {"error": "not found"})
        body, kind = found
        return Response(body, media_type=kind, headers={**security_headers(), "Cache-Control": "max-age=300"})

    @router.get("/login")
    def one_time_login(request: Request, once: str = "") -> Response:
        operator = sessions.caller_for_token(app.state.settings.api_token) if once else None
        if operator is not None and sessions.redeem(once):
            token, _ = sessions.open(*operator)
            return with_cookie(RedirectResponse("/ui/", status_code=303, headers=security_headers()), request, token)
        return RedirectResponse("/ui/login.html", status_code=303, headers=security_headers())

    @router.post("/api/login")
    async def login(request: Request) -> Response:
        if not _same_origin(request):
            return _json(403, {"error": "a login must come from this server's login page"})
        try:
            form = await request.json()
        except ValueError:
            return _json(400, {"error": "send JSON: {access_key_id, secret_access_key} or {api_token}"})
        form = form if isinstance(form, dict) else {}
        found = (
            sessions.caller_for_token(str(form.get("api_token") or ""))
            if form.get("api_token")
            else sessions.caller_for_key(str(form.get("access_key_id") or ""), str(form.get("secret_access_key") or ""))
        )
        if found is None:
            return _json(401, {"error": "unknown access key, wrong secret or wrong token"})
        token, session = sessions.open(*found)
        return with_cookie(_json(200, {"user": session.caller.name}), request, token)

    @router.post("/api/logout")
    def logout(request: Request) -> Response:
        sessions.close(request.cookies.get(SESSION_COOKIE))
        response = _json(200, {"ok": True})
        response.delete_cookie(SESSION_COOKIE, path="/ui")
        return response

    @router.get("/{page}")
    @router.get("/")
    def page(request: Request, page: str = "") -> Response:
        if page == "login.html":
            login = static_file("login.html")
            if login is None:
                return _json(404, {"error": "not found"})  # a package built without the dashboard's files
            return Response(login[0], media_type=login[1], headers=security_headers())
        if page not in PAGES:
            return _json(404, {"error": "not found"})
        if session_of(request) is None:
            return RedirectResponse("/ui/login.html", status_code=303, headers=security_headers())
        found = static_file(PAGES[page])
        if found is None:
            return _json(404, {"error": "not found"})
        body, kind = found
        return Response(body, media_type=kind, headers={**security_headers(), "Cache-Control": "no-store"})

    @router.get("/api/{path:path}")
    def api(request: Request, path: str) -> Response:
        session = session_of(request)
        if session is None:
            return _json(401, {"error": "log in at /ui/login.html"})
        if path == "session":
            return _json(200, {"mode": "service", "user": session.caller.name, "can_stop": True, "csrf": session.csrf})
        dashboard, source = _dashboard(request, session)
        query = request.query_params
        parts = path.split("/")
        try:
            if path == "runs":
                return _json(*dashboard.list_runs(query.get("q", "")))
            if len(parts) == 2 and parts[0] == "runs":
                return _json(*dashboard.detail(parts[1]))
            if len(parts) == 3 and parts[0] == "runs":
                if parts[2] == "series":
                    since = query.get("since", "")
                    return _json(*dashboard.series(parts[1], int(since) if since.isdigit() else None))
                if parts[2] == "histogram" and query.get("step", "").isdigit() and query.get("tensor"):
                    return _json(
                        *dashboard.histogram(parts[1], query["tensor"], int(query["step"]), query.get("worker"))
                    )
                if parts[2] == "logs" and dashboard.find(parts[1]) is not None:
                    name = source.by_id[parts[1]]
                    text = app.state.service.logs(name, "training", _LOG_LINES, caller=session.caller)
                    return _json(200, {"lines": text.splitlines()[-_LOG_LINES:]})
        except JobNotFound:
            pass
        return _json(404, {"error": "not found"})

    @router.post("/api/runs/{run_id}/stop")
    def stop(request: Request, run_id: str) -> Response:
        session = session_of(request)
        if session is None:
            return _json(401, {"error": "log in at /ui/login.html"})
        token = request.headers.get("x-csrf-token", "")
        import hmac

        if not _same_origin(request) or not hmac.compare_digest(token.encode(), session.csrf.encode()):
            return _json(403, {"error": "refused: not from this dashboard's page (CSRF token or Origin)"})
        dashboard, source = _dashboard(request, session)
        if dashboard.find(run_id) is None:
            return _json(404, {"error": "not found"})
        name = source.by_id[run_id]
        service: JobService = app.state.service
        try:
            stopping = service.stop(
                name, None, cause=f"stopped from the dashboard by {session.caller.name}", caller=session.caller
            )
            return _json(
                202, {"name": name, "stopping": stopping, "status": service.job_for(session.caller, name).status}
            )
        except JobForbidden as error:
            return _json(403, {"error": f"{error} (the tenancy policy grants read only)"})
        except JobNotFound:
            return _json(404, {"error": "not found"})

    app.include_router(router)
