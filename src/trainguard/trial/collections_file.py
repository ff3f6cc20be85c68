"""A run's collections files (``collections/<worker>_collections.json``), read the way a trial
needs them: every collection once, the number of workers, and the run-level facts the hooks put
in their ``_meta`` (framework, independent optimizers, model scopes, payload checksums)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from trainguard.config.collections import CollectionManager
from trainguard.errors import MissingCollectionFiles
from trainguard.format.index import declares_payload_checksums
from trainguard.format.layout import COLLECTIONS_PREFIX, END_OF_TRAINING, is_collections_key
from trainguard.storage.base import Store

__all__ = ["RunCollections", "load_collections"]


@dataclass
class RunCollections:
    """What the collections files of a run say, merged over its workers."""

    manager: CollectionManager
    num_workers: int = 1
    framework: str | None = None
    independent_optimizers: int = 1
    model_scopes: dict[str, list[str]] = field(default_factory=dict)
    checksums_declared: bool = False


def load_collections(store: Store, timeout: float) -> RunCollections:
    """The run's collections, waiting up to ``timeout`` seconds for a first file.

    Raises:
        MissingCollectionFiles: none appeared in time (or training ended without one), or one
            is corrupt.
    """
    deadline = time.monotonic() + timeout
    while True:
        keys = [key for key in store.list(COLLECTIONS_PREFIX) if is_collections_key(key)]
        if keys:
            return _parse_all(store, keys)
        ended = store.exists(END_OF_TRAINING)
        if ended or time.monotonic() >= deadline:
            found = store.list("")[:5]
            what = f"it contains {found}" if found else "it is empty or does not exist"
            why = "training has ended without writing any" if ended else f"none appeared within {timeout:.0f} s"
            raise MissingCollectionFiles(
                f"{store.url} has no collections file ({COLLECTIONS_PREFIX}<worker>_collections.json): "
                f"{why}; {what}. Check that the path is the hook's out_dir and that the hook saved at least "
                "one step"
            )
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


def _parse_all(store: Store, keys: list[str]) -> RunCollections:
    run = RunCollections(CollectionManager())
    for key in keys:
        try:
            data = store.read(key)
            parsed, workers = CollectionManager.parse(data)
            run.framework = run.framework or CollectionManager.framework_of(data)
            meta = CollectionManager.meta_of(data)
            optimizers = meta.get("independent_optimizers", 1)
            if isinstance(optimizers, int):
                run.independent_optimizers = max(run.independent_optimizers, optimizers)
            scopes = meta.get("model_scopes")
            if isinstance(scopes, dict):
                run.model_scopes.update(scopes)
            if declares_payload_checksums(meta):
                run.checksums_declared = True
        except (ValueError, KeyError, TypeError) as error:
            raise MissingCollectionFiles(f"{store.url}/{key} is corrupt: {error}") from None
        run.num_workers = max(run.num_workers, workers)
        for collection in parsed:
            if collection.name not in run.manager:
                run.manager._collections[collection.name] = collection
    return run
