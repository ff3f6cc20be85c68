"""The FastAPI application factory. Settings are read when the app is built, never at import."""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from trainguard.services.api.db import make_engine, make_session_factory
from trainguard.services.api.guard import RequestGuard, max_body_bytes
from trainguard.services.api.jobs import JobService
from trainguard.services.api.reconciler import Reconciler
from trainguard.services.api.routes_native import native_router
from trainguard.services.api.routes_sagemaker import sagemaker_router
from trainguard.services.api.routes_ui import mount_ui
from trainguard.services.api.settings import Settings
from trainguard.services.launchers.base import Launcher

__all__ = ["create_app", "make_launcher"]

log = logging.getLogger("trainguard.api")


def _printable(value: Any, limit: int | None = 256) -> Any:
    """A value a JSON answer can carry: lone surrogates escaped, inf/NaN as text, containers left out."""
    if isinstance(value, str):
        value = value if limit is None or len(value) <= limit else value[: limit - 3] + "..."
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return None  # a whole object echoed back helps nobody (and may be a megabyte)


async def _validation_failed(request: Request, error: Exception) -> JSONResponse:
    """FastAPI's 422, minus what its default handler cannot encode (a NaN or a lone surrogate crashed it).

    Registered for RequestValidationError only; typed as Starlette's handlers are (any exception)."""
    if not isinstance(error, RequestValidationError):
        raise error
    detail = []
    for item in error.errors():
        entry = {
            "type": item.get("type"),
            "loc": [part if isinstance(part, int) else _printable(str(part)) for part in item.get("loc", ())],
            "msg": _printable(str(item.get("msg", "")), limit=None),  # the whole message: it says what to do
        }
        shown = _printable(item.get("input"))
        if shown is not None:
            entry["input"] = shown
        detail.append(entry)
    return JSONResponse(status_code=422, content={"detail": detail})


def _docker_launcher(settings: Settings) -> Launcher:
    from trainguard.services.launchers import docker as docker_module  # lazy: the Docker SDK is optional

    return docker_module.DockerLauncher(network=settings.docker_network or None)


def make_launcher(settings: Settings) -> Launcher:
    """TRAINGUARD_LAUNCHER=local|docker|ray; unset: docker if the engine answers, else local."""
    from trainguard.services.launchers.local import LocalLauncher

    if settings.launcher == "local":
        return LocalLauncher(settings.data_dir / "local")
    if settings.launcher == "docker":
        return _docker_launcher(settings)
    if settings.launcher == "ray":
        from trainguard.services.launchers.ray import RayLauncher  # lazy: Ray is an optional extra

        return RayLauncher(settings.ray_address or None, stop_grace_seconds=settings.stop_grace_seconds)
    try:
        launcher = _docker_launcher(settings)
        launcher.jobs()  # answers only if the engine does
        return launcher
    except Exception as error:  # noqa: BLE001 - any failure means: no usable Docker here
        log.info("no usable Docker engine (%s): using the local-process launcher", error)
        return LocalLauncher(settings.data_dir / "local")


def create_app(settings: Settings | None = None, launcher: Launcher | None = None) -> FastAPI:
    settings = settings or Settings.from_env()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    body_limit = max_body_bytes(settings, dict(os.environ))  # a bad value stops the start, not a request
    launcher = launcher or make_launcher(settings)
    sessions = make_session_factory(make_engine(settings.database_url))
    service = JobService(sessions, launcher, settings)
    # The reconciler's writes are derived from the launcher and written again on its next tick if
    # lost, so they skip the fsync that creations, stops and rule reports keep.
    derived_sessions = (
        make_session_factory(make_engine(settings.database_url, durable_commits=False))
        if settings.database_url.startswith("sqlite")
        else sessions
    )
    reconciler = Reconciler(service, settings.reconcile_interval, sessions=derived_sessions)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.resume_actions()
        service.resume_launches()  # jobs accepted but not launched before a restart
        reconciler.start()  # its first tick re-attaches to every unsettled job in the database
        try:
            yield
        finally:
            reconciler.close()
            service.close()

    app = FastAPI(
        title="trainguard control API",
        version="0.1.0",
        description=(
            "Submit training jobs with rules, follow their status and findings, stop them. "
            "Native REST under /v1 (Bearer token); SageMaker-compatible awsJson 1.1 on POST /."
        ),
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.add_exception_handler(RequestValidationError, _validation_failed)
    app.state.service = service
    app.state.reconciler = reconciler

    @app.get("/health", tags=["health"], summary="Liveness; the only route without authentication")
    def health() -> dict[str, str]:
        return {"status": "ok", "launcher": launcher.name}

    app.include_router(native_router)
    app.include_router(sagemaker_router)
    mount_ui(app)  # the dashboard at /ui/: its own login (browsers cannot sign), the native API's tenancy
    # Outermost: authentication from the headers and the body limit come before any route reads.
    app.add_middleware(RequestGuard, max_body_bytes=body_limit)
    return app
