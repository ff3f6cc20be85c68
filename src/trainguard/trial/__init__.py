"""Read runs, finished or live, local or on S3: ``create_trial(path)``."""

from __future__ import annotations

import os
from typing import Any

from trainguard.storage import is_remote, open_store
from trainguard.trial.tensor import Tensor
from trainguard.trial.trial import StepState, Trial

__all__ = ["StepState", "Tensor", "Trial", "create_trial"]


def create_trial(
    path: str | os.PathLike[str],
    name: str | None = None,
    *,
    collection_wait_timeout: float = 60.0,
    cache: bool | str | os.PathLike[str] = True,
    endpoint_url: str | None = None,
    refresh_interval: float | None = None,
    profile: str | None = None,
    region: str | None = None,
    **store_options: Any,
) -> Trial:
    """Open the run at ``path`` (a directory or ``s3://bucket/prefix``).

    Args:
        path: the hook's ``out_dir``.
        name: a display name; defaults to the last path component.
        collection_wait_timeout: how long to wait for a live run's first collections file.
        cache: for ``s3://`` runs, keep fetched objects on local disk (``True`` uses
            ``$TRAINGUARD_CACHE_DIR`` or ``~/.cache/trainguard``; a path chooses the folder).
        endpoint_url: an S3-compatible endpoint (MinIO, moto, ...).
        profile: the AWS profile; region: the AWS region. These three default to the
            environment (:mod:`trainguard.storage.options`).
        refresh_interval: at most this often (seconds) a question to the trial lists the run for
            new steps (``refresh(force=True)`` always does); default 0 for a directory, 1 for S3.

    Raises:
        MissingCollectionFiles: no collections file appeared within the timeout.
    """
    remote = is_remote(path)
    if remote:
        from trainguard.storage.options import StorageOptions

        store_options.update(StorageOptions(endpoint_url, profile, region).store_kwargs())
    store = open_store(path, **store_options)
    if remote and cache:
        from trainguard.format.layout import COLLECTIONS_PREFIX
        from trainguard.storage.cache import CachingStore

        # The collections file is rewritten at close (tensor names added during training), so
        # it is the one object of a run that must never be served from the cache.
        store = CachingStore(store, None if cache is True else cache, uncached_prefixes=(COLLECTIONS_PREFIX,))
    return Trial(
        store,
        name=name,
        collection_wait_timeout=collection_wait_timeout,
        refresh_interval=(1.0 if remote else 0.0) if refresh_interval is None else refresh_interval,
        parallel_reads=8 if remote else 1,
    )
