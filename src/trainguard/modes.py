"""Training modes, numbered as smdebug's ``ModeKeys`` so files stay interchangeable."""

from __future__ import annotations

import enum

__all__ = ["ModeKeys", "modes"]


class ModeKeys(enum.Enum):
    TRAIN = 1
    EVAL = 2
    PREDICT = 3
    GLOBAL = 4

    # Identity hash, in C: Enum's own __hash__ is a Python function, and the step counters are
    # dicts keyed by mode that every unsaved training step updates (members are singletons, and
    # equality is identity, so this hash agrees with ==).
    __hash__ = object.__hash__

    @classmethod
    def parse(cls, value: ModeKeys | str | int) -> ModeKeys:
        """Accept a mode, its name (any case) or its number."""
        if isinstance(value, ModeKeys):
            return value
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                pass
        elif isinstance(value, int):
            try:
                return cls(value)
            except ValueError:
                pass
        from trainguard.errors import ConfigError

        raise ConfigError(f"unknown mode {value!r}: use one of TRAIN, EVAL, PREDICT, GLOBAL")


# smdebug users write `smd.modes.TRAIN`; keep that spelling working.
modes = ModeKeys
