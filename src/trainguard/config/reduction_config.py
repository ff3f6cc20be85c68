"""What to save of a tensor: the raw value, small reductions of it, or both."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from trainguard.errors import ConfigError

__all__ = ["ALLOWED_NORMS", "ALLOWED_REDUCTIONS", "ReductionConfig", "reduction_tensor_name"]

ALLOWED_REDUCTIONS = ("min", "max", "mean", "std", "variance", "sum", "prod", "zero_fraction")
ALLOWED_NORMS = ("l1", "l2")


def reduction_tensor_name(tensor_name: str, reduction: str, *, absolute: bool = False) -> str:
    """smdebug's name for a saved reduction: ``smdebug/reductions/[abs_]<red>/<tensor>``."""
    return f"smdebug/reductions/{'abs_' if absolute else ''}{reduction}/{tensor_name}"


def _check(kind: str, names: Iterable[str], allowed: tuple[str, ...]) -> tuple[str, ...]:
    if isinstance(names, str):
        names = [names]
    checked = []
    for name in names:
        if name not in allowed:
            raise ConfigError(f"unknown {kind} {name!r}: choose from {', '.join(allowed)}")
        checked.append(name)
    return tuple(checked)


@dataclass(frozen=True)
class ReductionConfig:
    """smdebug's ReductionConfig, plus ``zero_fraction`` (share of exact zeros, for dead units)."""

    reductions: tuple[str, ...] = ()
    abs_reductions: tuple[str, ...] = ()
    norms: tuple[str, ...] = ()
    abs_norms: tuple[str, ...] = ()
    save_raw_tensor: bool = False
    save_shape: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "reductions", _check("reduction", self.reductions, ALLOWED_REDUCTIONS))
        object.__setattr__(self, "abs_reductions", _check("reduction", self.abs_reductions, ALLOWED_REDUCTIONS))
        object.__setattr__(self, "norms", _check("norm", self.norms, ALLOWED_NORMS))
        object.__setattr__(self, "abs_norms", _check("norm", self.abs_norms, ALLOWED_NORMS))
        for flag in ("save_raw_tensor", "save_shape"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"{flag}={getattr(self, flag)!r} must be True or False")

    @property
    def has_reductions(self) -> bool:
        return bool(self.reductions or self.abs_reductions or self.norms or self.abs_norms)

    def requested(self) -> list[tuple[str, bool]]:
        """(name, absolute) pairs, norms named ``l1``/``l2`` as in smdebug's tensor names."""
        return (
            [(name, False) for name in self.reductions]
            + [(name, True) for name in self.abs_reductions]
            + [(name, False) for name in self.norms]
            + [(name, True) for name in self.abs_norms]
        )

    @classmethod
    def from_tokens(
        cls, tokens: str | Iterable[str], *, save_raw_tensor: bool = False, save_shape: bool = False
    ) -> ReductionConfig:
        """Parse smdebug's comma list: ``"min,max,abs_l2_norm"``."""
        if isinstance(tokens, str):
            tokens = [token.strip() for token in tokens.split(",") if token.strip()]
        buckets: dict[str, list[str]] = {"reductions": [], "abs_reductions": [], "norms": [], "abs_norms": []}
        for token in tokens:
            absolute = token.startswith("abs_")
            base = token[4:] if absolute else token
            if base.endswith("_norm"):
                buckets["abs_norms" if absolute else "norms"].append(base[: -len("_norm")])
            elif base == "median":
                raise ConfigError("reduction 'median' is not supported (it needs a sort of every tensor): use mean")
            else:
                buckets["abs_reductions" if absolute else "reductions"].append(base)
        return cls(
            reductions=tuple(buckets["reductions"]),
            abs_reductions=tuple(buckets["abs_reductions"]),
            norms=tuple(buckets["norms"]),
            abs_norms=tuple(buckets["abs_norms"]),
            save_raw_tensor=save_raw_tensor,
            save_shape=save_shape,
        )

    def to_json(self) -> dict[str, Any]:
        tokens = (
            list(self.reductions)
            + [f"abs_{name}" for name in self.abs_reductions]
            + [f"{name}_norm" for name in self.norms]
            + [f"abs_{name}_norm" for name in self.abs_norms]
        )
        return {"save_raw_tensor": self.save_raw_tensor, "reductions": ",".join(tokens), "save_shape": self.save_shape}
