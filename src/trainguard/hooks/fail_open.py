"""Fail open: an error inside trainguard must never break the user's training.

Every entry point called from framework hooks is wrapped with :func:`fail_open`: the first
error logs one line (with the stack at debug level), disables capture on that hook, and the
training step goes on as if trainguard were not there.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

logger = logging.getLogger("trainguard")

F = TypeVar("F", bound=Callable[..., Any])


class Disableable(Protocol):
    enabled: bool

    def disable(self, reason: BaseException | str) -> None: ...


def fail_open(method: F) -> F:
    """Wrap a hook method: if it raises, disable the hook and return None."""

    @functools.wraps(method)
    def wrapper(self: Disableable, *args: Any, **kwargs: Any) -> Any:
        if not self.enabled:
            return None
        try:
            return method(self, *args, **kwargs)
        except Exception as error:  # noqa: BLE001 - the whole point is to catch everything
            self.disable(error)
            return None

    return wrapper  # type: ignore[return-value]


def log_disabled(where: str, reason: BaseException | str) -> None:
    """The one log line a disabled hook writes."""
    if isinstance(reason, BaseException):
        logger.warning(
            "trainguard: capture disabled for %s after an internal error (%s: %s); training continues",
            where,
            type(reason).__name__,
            reason,
        )
        logger.debug("trainguard: traceback of the error that disabled capture", exc_info=reason)
    else:
        logger.warning("trainguard: capture disabled for %s: %s; training continues", where, reason)
