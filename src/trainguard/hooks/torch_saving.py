"""TorchHook's tensor saving: how a torch tensor due at this step reaches the writer.

Raw values are snapshotted to host memory once per tensor and step (a Sequential's module output
is the next one's input: one copy serves both names) and handed to the writer in batches;
reductions are computed on the tensor's device and handed over as one vector per tensor. Values
held back until the step ends (gradients, losses) are snapshotted when held.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from trainguard.config.reduction_config import reduction_tensor_name
from trainguard.hooks.torch_tensors import HostSnapshot, reduce_on_device, snapshot
from trainguard.writer.thread import TensorItem

if TYPE_CHECKING:
    from trainguard.hooks.base import SavePlan

__all__ = ["SavingCore", "TensorSaver"]

Requested = tuple[tuple[str, bool], ...]


class SavingCore(Protocol):
    """What the saver needs of the hook: the plan of a name at this step, and the open writer."""

    def plan(self, tensor_name: str) -> SavePlan | None: ...

    @property
    def step_writer(self) -> Any: ...


class TensorSaver:
    """The torch tensors a step saves, from the hook's plan to its writer."""

    def __init__(self, core: SavingCore) -> None:
        self._core = core
        # id(tensor) -> (tensor, its version when copied, the copy): this step's host copies
        self._step_snapshots: dict[int, tuple[torch.Tensor, int, HostSnapshot]] = {}
        # (tensor name, requested reductions) -> the reductions' tensor names
        self._reduction_names: dict[tuple[str, Requested], list[str]] = {}
        # name -> (raw snapshot, reductions snapshot, requested reductions), written at step end
        self.held: dict[str, tuple[HostSnapshot | None, HostSnapshot | None, Requested]] = {}

    def save(self, name: str, tensor: torch.Tensor) -> bool:
        """Save now, if ``name`` is due at this step; True if it was."""
        raw: list[TensorItem] = []
        saved = self._save_due(name, tensor, raw)
        self._write_raw(raw)
        return saved

    def save_many(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """:meth:`save` for several tensors; their raw values go to the writer in one call (a
        saved step's parameters: a dozen or more small tensors)."""
        raw: list[TensorItem] = []
        for name, tensor in named_tensors:
            self._save_due(name, tensor, raw)
        self._write_raw(raw)

    def _write_raw(self, items: list[TensorItem]) -> None:
        writer = self._core.step_writer
        if writer is not None and items:
            writer.add_tensors(items)

    def _save_due(self, name: str, tensor: torch.Tensor, raw: list[TensorItem]) -> bool:
        """Queue ``tensor``'s raw value on ``raw`` and hand its reductions over, if due."""
        plan = self._core.plan(name)
        if plan is None:
            return False
        if plan.save_raw:
            source, nbytes, proto_dtype = self._snapshot_once(tensor)
            raw.append((name, source, nbytes, proto_dtype))
        if plan.reductions:
            copy = not getattr(self._core.step_writer, "copies_at_hand_over", False)
            self.write_reductions(name, reduce_on_device(tensor, plan.reductions, copy=copy), plan.reductions)
        return True

    def _snapshot_once(self, tensor: torch.Tensor) -> HostSnapshot:
        taken = self._step_snapshots.get(id(tensor))
        if taken is not None and taken[0] is tensor and taken[1] == tensor._version:
            return taken[2]
        # The writer process copies at hand-over, which comes right after: no clone needed then.
        copy = snapshot(tensor, copy=not getattr(self._core.step_writer, "copies_at_hand_over", False))
        self._step_snapshots[id(tensor)] = (tensor, tensor._version, copy)
        return copy

    def hold(self, name: str, tensor: torch.Tensor) -> None:
        """Save at the end of the step; a later value of the same name replaces this one."""
        plan = self._core.plan(name)
        if plan is None:
            return
        raw = snapshot(tensor) if plan.save_raw else None
        reduced = reduce_on_device(tensor, plan.reductions) if plan.reductions else None
        self.held[name] = (raw, reduced, plan.reductions)

    def write_held(self) -> None:
        """The step ends: what was held goes to the writer."""
        held, self.held = self.held, {}
        self._write_raw([(name, raw[0], raw[1], raw[2]) for name, (raw, _, _) in held.items() if raw is not None])
        for name, (_, reduced, requested) in held.items():
            self.write_reductions(name, reduced, requested)

    def step_ended(self) -> None:
        """This step's host copies are not reused by the next one."""
        self._step_snapshots.clear()

    def write_reductions(self, name: str, reduced: HostSnapshot | None, requested: Requested) -> None:
        writer = self._core.step_writer
        if reduced is None or writer is None:
            return
        names = self._reduction_names.get((name, requested))
        if names is None:
            names = [reduction_tensor_name(name, reduction, absolute=absolute) for reduction, absolute in requested]
            self._reduction_names[(name, requested)] = names
        writer.add_reductions(names, reduced[0])
