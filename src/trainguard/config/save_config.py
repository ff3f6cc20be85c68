"""When to save: per-mode schedules, smdebug's ``SaveConfig`` API.

Two deliberate differences from smdebug 1.0.34 (its bug list, items 9):

* ``save_steps`` given alone means *exactly those steps*; smdebug silently added them to the
  default interval of 500. Giving both an interval and steps saves their union.
* The interval counts from ``start_step``: ``start_step=5, save_interval=10`` saves 5, 15, 25;
  smdebug saved 10, 20, 30.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainguard.errors import ConfigError
from trainguard.modes import ModeKeys

__all__ = ["DEFAULT_SAVE_INTERVAL", "SaveConfig", "SaveConfigMode"]

DEFAULT_SAVE_INTERVAL = 500


def _non_negative_int(name: str, value: Any, *, minimum: int = 0) -> int:
    try:
        number = int(value)
        if number != float(value):
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={value!r} is not an integer: give a whole number >= {minimum}") from None
    if number < minimum:
        raise ConfigError(f"{name}={value!r} must be >= {minimum}")
    return number


def _parse_steps(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    if not isinstance(value, Iterable):
        raise ConfigError(f"save_steps={value!r} must be a list of step numbers, e.g. [1, 10, 100] or '1,10,100'")
    return tuple(sorted({_non_negative_int("save_steps", step) for step in value}))


@dataclass(frozen=True)
class SaveConfigMode:
    """The schedule of one mode. ``end_step`` is exclusive; None means no end."""

    save_interval: int | None = None
    start_step: int = 0
    end_step: int | None = None
    save_steps: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.save_interval is not None:
            object.__setattr__(self, "save_interval", _non_negative_int("save_interval", self.save_interval, minimum=1))
        object.__setattr__(self, "start_step", _non_negative_int("start_step", self.start_step))
        if self.end_step is not None:
            object.__setattr__(self, "end_step", _non_negative_int("end_step", self.end_step))
        object.__setattr__(self, "save_steps", _parse_steps(self.save_steps))

    @property
    def effective_interval(self) -> int | None:
        if self.save_interval is not None:
            return self.save_interval
        return None if self.save_steps else DEFAULT_SAVE_INTERVAL

    def should_save(self, mode_step: int) -> bool:
        if mode_step in self.save_steps:
            return True
        interval = self.effective_interval
        if interval is None or mode_step < self.start_step:
            return False
        if self.end_step is not None and mode_step >= self.end_step:
            return False
        return (mode_step - self.start_step) % interval == 0

    def next_save(self, mode_step: int) -> int | None:
        """The first step after ``mode_step`` that :meth:`should_save` says yes to; None if none."""
        after = mode_step + 1
        listed = bisect.bisect_left(self.save_steps, after)
        found = self.save_steps[listed] if listed < len(self.save_steps) else None
        interval = self.effective_interval
        if interval is not None:
            first = max(after, self.start_step)
            candidate = first + (-(first - self.start_step)) % interval  # the next multiple from start_step
            if (self.end_step is None or candidate < self.end_step) and (found is None or candidate < found):
                found = candidate
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "save_interval": self.effective_interval or 0,
            "save_steps": list(self.save_steps),
            "start_step": self.start_step,
            "end_step": self.end_step,
        }


class SaveConfig:
    """A schedule per mode, smdebug-style.

    Args:
        mode_save_configs: optional ``{mode: SaveConfigMode}`` overriding the defaults per mode.
        save_interval, start_step, end_step, save_steps: the schedule of modes not given above.
    """

    def __init__(
        self,
        mode_save_configs: Mapping[ModeKeys | str, SaveConfigMode | None] | None = None,
        save_interval: int | None = None,
        start_step: int = 0,
        end_step: int | None = None,
        save_steps: Iterable[int] | str | None = None,
    ) -> None:
        default = SaveConfigMode(save_interval, start_step, end_step, tuple(_parse_steps(save_steps)))
        self._modes: dict[ModeKeys, SaveConfigMode] = {mode: default for mode in ModeKeys}
        # A schedule given as arguments applies to every mode; only modes left entirely to the
        # defaults fall back to the hook's schedule when a collection's config is merged.
        given = save_interval is not None or start_step != 0 or end_step is not None or bool(default.save_steps)
        self._explicit: set[ModeKeys] = set(ModeKeys) if given else set()
        for mode, config in (mode_save_configs or {}).items():
            if config is not None:
                parsed = ModeKeys.parse(mode)
                self._modes[parsed] = config
                self._explicit.add(parsed)

    def get_save_config(self, mode: ModeKeys) -> SaveConfigMode:
        return self._modes[mode]

    def should_save_step(self, mode: ModeKeys, mode_step: int) -> bool:
        return self._modes[mode].should_save(mode_step)

    def next_save_step(self, mode: ModeKeys, mode_step: int) -> int | None:
        """The first step of ``mode`` after ``mode_step`` this schedule saves; None if none."""
        return self._modes[mode].next_save(mode_step)

    def merged_with(self, fallback: SaveConfig) -> SaveConfig:
        """This config for modes it sets explicitly, ``fallback``'s otherwise."""
        merged = SaveConfig()
        merged._modes = {
            mode: self._modes[mode] if mode in self._explicit else fallback._modes[mode] for mode in ModeKeys
        }
        merged._explicit = self._explicit | fallback._explicit
        return merged

    def to_json(self) -> dict[str, Any]:
        return {mode.name: self._modes[mode].to_json() for mode in ModeKeys}

    def to_dict(self) -> dict[str, Any]:
        """Everything this config holds, for :meth:`from_dict` (``to_json`` is smdebug's shape,
        which drops which modes were given explicitly, and with it how collections merge)."""
        return {
            "modes": {mode.name: dataclasses.asdict(self._modes[mode]) for mode in ModeKeys},
            "explicit": sorted(mode.name for mode in self._explicit),
        }

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> SaveConfig:
        """The config :meth:`to_dict` described; a ConfigError names what is malformed."""
        modes = document.get("modes") if isinstance(document, Mapping) else None
        explicit = document.get("explicit", []) if isinstance(document, Mapping) else None
        if not isinstance(modes, Mapping) or not isinstance(explicit, list):
            raise ConfigError("save_config must be an object with 'modes' and 'explicit'")
        config = cls()
        for name, values in modes.items():
            if not isinstance(values, Mapping):
                raise ConfigError(f"save_config.modes.{name} must be an object")
            try:
                config._modes[ModeKeys.parse(name)] = SaveConfigMode(**values)
            except TypeError as error:
                raise ConfigError(f"save_config.modes.{name}: {error}") from None
        config._explicit = {ModeKeys.parse(name) for name in explicit}
        return config

    def __repr__(self) -> str:
        return f"SaveConfig({ {mode.name: config for mode, config in self._modes.items()} })"
