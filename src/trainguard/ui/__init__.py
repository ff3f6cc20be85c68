"""A live dashboard of runs: ``trainguard ui [PATH_OR_S3_URI ...]`` and ``/ui/`` in ``trainguard serve``.

Parts: :mod:`~trainguard.ui.discover` (which runs), :mod:`~trainguard.ui.live` (one run followed
incrementally), :mod:`~trainguard.ui.curves` and :mod:`~trainguard.ui.downsample` (bounded,
min/max-downsampled curves with non-finite markers), :mod:`~trainguard.ui.findings` (diagnosis,
advice, rules table), :mod:`~trainguard.ui.views` (the JSON documents),
:mod:`~trainguard.ui.dashboard` (answers for pages), :mod:`~trainguard.ui.server` (standard-library
HTTP server) and ``static/`` (pages, scripts, and uPlot vendored from npm). See docs/dashboard.md.
"""

from __future__ import annotations

from trainguard.ui.dashboard import Dashboard, PathRuns
from trainguard.ui.server import UiServer

__all__ = ["Dashboard", "PathRuns", "UiServer", "serve_paths"]


def serve_paths(
    paths: list[str], *, host: str = "127.0.0.1", port: int = 0, endpoint_url: str | None = None
) -> UiServer:
    """A started dashboard server over ``paths`` (default ``trainguard-runs/``)."""
    return UiServer(Dashboard(PathRuns(paths, endpoint_url=endpoint_url)), host=host, port=port).start()
