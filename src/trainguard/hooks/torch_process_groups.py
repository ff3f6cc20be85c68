"""Process groups a zero-code script destroys are released where PyTorch's teardown cannot deadlock.

``torch.distributed.destroy_process_group()`` forgets the groups; the group object itself dies
with its last reference. Scripts written as the PyTorch examples are call it while their
``DistributedDataParallel`` model is still alive, so the DDP ``Reducer`` holds the last reference
and the group dies when the model does, inside the Reducer's deallocation, which keeps the GIL:
``~ProcessGroupGloo`` then joins gloo's worker threads while holding it. A worker that is just
freeing a finished allreduce needs the GIL for it (the work's thread-local state holds the
``contextvars.Context`` that ``torch.autograd.backward`` stashed), so the rank deadlocks forever
after training (issue 48: ``py-spy dump --native`` shows the main thread in
``std::thread::join`` under ``~Reducer`` and a gloo thread in ``gil_scoped_acquire`` under
``~AsyncAllreduceWork``). The group's own Python object releases the GIL before the C++
destructor runs, so when *it* holds the last reference the join is harmless.

:class:`ProcessGroupKeeper` (held by the zero-code hook, which wraps ``destroy_process_group``
through it) keeps the Python objects of the groups a script destroys, and drops them at
interpreter exit: by then the script's model is normally gone, so the group's last reference is
ours and its destruction releases the GIL. Nothing else changes: the groups are destroyed for
PyTorch exactly as the script asked, and a failure here never reaches the script.
"""

from __future__ import annotations

import atexit
import functools
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["ProcessGroupKeeper"]

logger = logging.getLogger("trainguard")


class ProcessGroupKeeper:
    """Keeps the groups a script destroys until interpreter exit (see the module docstring)."""

    def __init__(self) -> None:
        self._kept: list[Any] = []
        self._exit_registered = False

    def wrap(self, destroy: Callable[..., Any]) -> Callable[..., Any]:
        """``destroy_process_group`` that hands the groups it destroys to this keeper first."""
        keeper = self

        @functools.wraps(destroy)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            keeper.keep(_groups_destroyed(*args, **kwargs))
            return destroy(*args, **kwargs)

        return destroy_process_group

    def keep(self, groups: list[Any]) -> None:
        if not groups:
            return
        self._kept.extend(groups)
        if not self._exit_registered:
            # atexit runs its handlers last-registered first: this one, registered during
            # training, runs before the hook's own close (registered as torch was imported)
            atexit.register(self.release)
            self._exit_registered = True

    def release(self) -> None:
        """Drop the kept groups (a group whose last reference this was is destroyed now, with
        the GIL released by its Python object)."""
        kept, self._kept = self._kept, []
        kept.clear()

    @property
    def kept(self) -> int:
        return len(self._kept)


def _groups_destroyed(group: Any = None, *_: Any, **__: Any) -> list[Any]:
    """The group objects ``destroy_process_group(group)`` will forget: ``group``, or every group
    when it is None or the default group."""
    try:
        from torch.distributed import distributed_c10d as c10d

        if group is not None and group is not c10d.GroupMember.WORLD:
            return [group]
        return list(c10d._world.pg_map.keys())
    except Exception:  # noqa: BLE001 - private API: without it the script's own teardown is as it was
        logger.debug("trainguard: could not read the process groups being destroyed", exc_info=True)
        return []
