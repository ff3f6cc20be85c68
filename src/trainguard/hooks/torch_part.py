"""What every part of the PyTorch hook needs of the hook itself (its core): whether capture is on,
and how to turn it off. A part's entry points are wrapped with :func:`fail_open`, which asks the
part these two things; the part asks the core, so that one error anywhere disables the whole hook.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["CoreSwitch", "HookPart"]


class CoreSwitch(Protocol):
    enabled: bool

    def disable(self, reason: BaseException | str) -> None: ...


class HookPart:
    """A part of a hook that holds its core; fail-open entry points disable the core."""

    __slots__ = ("_core",)

    def __init__(self, core: CoreSwitch) -> None:
        self._core = core

    @property
    def enabled(self) -> bool:
        return self._core.enabled

    def disable(self, reason: BaseException | str) -> None:
        self._core.disable(reason)
