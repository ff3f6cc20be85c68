"""ReplicaDivergence: data-parallel replicas whose parameters, or all-reduced gradients, differ.

Every rank of a data-parallel run must hold the same parameters after each optimizer step, and
apply the same (all-reduced) gradients. The hook writes a fingerprint per rank on the steps the
``replica_fingerprints`` collection is due (hooks/torch_fingerprint.py: per parameter a hash of
its raw bits and its sum of squares). At every such step this rule compares the ranks that
wrote one, once every rank of the run (``world`` in the collections files) wrote it; at the
end of training, whichever two or more did (a rank whose files land late is compared then):

* a parameter (or gradient) is **divergent** at step ``s`` when two ranks' hashes differ, or,
  with ``tolerance > 0``, when their sums of squares (and sums, in files that hold them) differ
  by more than ``tolerance`` relative. Ranks holding a group of equal values larger than any other are the reference
  and the others are named; without such a majority (two ranks that disagree, or every rank
  its own values) every rank is named and the finding says which is off cannot be told;
* the finding names the tensor, the ranks that disagree, the first step they did and a fix
  hint read from what disagrees (below). It is **certain** once the same tensor still differs at
  a second fingerprint step, so ``--stop-on-issue`` stops the job then: a divergence never heals
  by itself (nothing re-broadcasts parameters), and one fingerprint could have been read while
  a rank's file was still incomplete, which two cannot;
* not judged, and said so ("not evaluated" in the details, ``unjudged``): tensors declared
  sharded (FSDP, DTensor, DeepSpeed ZeRO partitions) and tensors of a different size on some
  rank (only a shard is). Buffers are not fingerprinted: each rank's batch updates BatchNorm's
  running statistics after DDP broadcast them, so they legitimately differ at a step's end.

Which fault it is, from what disagrees (the fix hint):

* gradients of **some** parameters differ: those are not all-reduced, they live outside the
  module DDP wraps (or DDP was told to ignore them);
* gradients of **every** parameter differ: nothing is all-reduced: a ``no_sync()`` context never
  left, or the model not wrapped in DDP at all. A rank that skipped ``optimizer.step()`` looks
  the same here: trainguard's steps end at ``optimizer.step()``, so that rank's step numbers lag
  behind the others' and its gradients at "the same" step are another iteration's. The hint
  names both; the rule cannot tell them apart from fingerprints alone;
* gradients agree, parameters differ from the first fingerprint on: the ranks started from
  different values (seeded per rank, never broadcast);
* gradients agree, a rank's parameters are unchanged since its previous fingerprint while the
  reference's changed: that rank's optimizer did not step;
* gradients agree, parameters differ later: a rank's values were changed outside the
  all-reduced update (an in-place edit on one rank, a skipped or doubled step on one rank).

Exactly equal is right for DDP (the all-reduce hands every rank the same bits, and every rank
then applies the same update); ``tolerance`` is for reductions that are not deterministic across
ranks (a hand-written all-reduce whose order differs per rank). It needs two or more workers'
fingerprints: a single-process run is not applicable, and a run in which only rank 0 wrote them
(``other_workers_collections`` set without ``replica_fingerprints``) is not evaluated.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainguard.errors import StorageError, TensorUnavailableForStep
from trainguard.rules.base import Rule, StepResult
from trainguard.rules.builtin._replicas import HASH, Disagreement, as_rows, compare_ranks
from trainguard.rules.params import Param

__all__ = ["ReplicaDivergence"]

COLLECTION = "replica_fingerprints"  # (hooks/torch_fingerprint.py's names: the rules never import hooks)
PARAMETERS_TENSOR = "replica_fingerprint/parameters"
GRADIENTS_TENSOR = "replica_fingerprint/gradients"
META_KEY = "replica_fingerprints"
_SHOWN = 3  # tensors named in a message


def _non_negative(value: float) -> str | None:
    return None if value >= 0 else "must be 0 or more"


def _ranks(ranks: Any) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(rank) for rank in ranks)


class ReplicaDivergence(Rule):
    """Data-parallel replicas whose parameters or all-reduced gradients differ between ranks."""

    rule_name = "ReplicaDivergence"
    per_worker = False  # it compares the workers
    collections = (COLLECTION,)
    frameworks = ("pytorch",)
    stop_policy = "stops training once the same tensor differs between ranks at a second fingerprint step (certain)"
    fix_hint = (
        "Keep every replica's update inside the all-reduce: put every trained parameter in the module "
        "DistributedDataParallel wraps, leave no_sync() for the step that syncs, broadcast initial values "
        "(DDP does) and never edit one rank's parameters alone."
    )

    tolerance = Param(float, 0.0,
                      "relative difference of sums of squares below which differing bits count as equal (0: exact)",
                      check=_non_negative)  # fmt: skip
    compare_gradients = Param(bool, True, "also compare the gradients each rank's optimizer applies")

    def __init__(self, base_trial: Any, **kwargs: Any) -> None:
        super().__init__(base_trial, **kwargs)
        self._compared: dict[tuple[str, int], int] = {}  # (tensor, step) -> workers compared there
        self._first: dict[tuple[str, str], tuple[int, tuple[int, ...]]] = {}  # (kind, name) -> step, ranks
        # (kind, name) -> the fingerprint steps it differed at: a set, so that a step judged again
        # (the runner may re-check one as more of its workers appear) never counts as a second one
        self._seen_at: dict[tuple[str, str], set[int]] = {}
        self._meta: dict[str, dict[str, Any]] = {}
        self._first_step: int | None = None  # the run's first fingerprint step
        self._previous: dict[str, tuple[int, dict[str, float]]] = {}  # worker -> its last step, name -> hash
        self._unjudged: set[str] = set()
        self._compared_any = False
        self._final = False  # training ended: compare the ranks that wrote, however many

    # -- the run's facts -------------------------------------------------------------------------
    def _worker_meta(self, worker: str, rows: int) -> dict[str, Any]:
        meta = self._meta.get(worker)
        if meta is None or len(meta.get("parameters", ())) < rows:
            self._read_meta()
        return self._meta.get(worker, {})

    def _world(self) -> int:
        worlds = [meta.get("world") for meta in self._meta.values()]
        if not worlds:
            self._read_meta()
            worlds = [meta.get("world") for meta in self._meta.values()]
        return max([world for world in worlds if isinstance(world, int)] or [2])

    def _read_meta(self) -> None:
        from trainguard.config.collections import CollectionManager
        from trainguard.format.layout import COLLECTIONS_PREFIX, is_collections_key

        store = getattr(self.base_trial, "store", None)
        if store is None:
            return
        try:
            for key in store.list(COLLECTIONS_PREFIX):
                if is_collections_key(key):
                    found = CollectionManager.meta_of(store.read(key)).get(META_KEY)
                    worker = key.rsplit("/", 1)[-1].removesuffix("_collections.json")
                    if isinstance(found, dict) and isinstance(found.get("parameters"), list):
                        self._meta[worker] = found
        except (StorageError, OSError, ValueError):
            return

    # -- evaluation ------------------------------------------------------------------------------
    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not trial.has_tensor(PARAMETERS_TENSOR):
            return None
        best: StepResult | None = None
        # Earlier steps too: a rank's files may land after rank 0's step was evaluated.
        for fingerprint_step in trial.tensor(PARAMETERS_TENSOR).steps():
            if fingerprint_step > step:
                break
            result = self._evaluate(fingerprint_step, step)
            if result is not None and (best is None or (result.fired, result.certain) > (best.fired, best.certain)):
                best = result
        return best

    def finish(self) -> StepResult | None:
        trial = self.base_trial
        # the last files of a slower rank may land after rank 0's last step was evaluated
        refresh = getattr(trial, "refresh", None)
        if callable(refresh):
            refresh()
        self._final = True
        steps = trial.tensor(PARAMETERS_TENSOR).steps() if trial.has_tensor(PARAMETERS_TENSOR) else []
        late = self.check(steps[-1]) if steps else None
        if self._compared_any:
            return late if late is not None and late.fired else None
        self._read_meta()
        worlds = [meta.get("world") for meta in self._meta.values()]
        if not trial.has_tensor(PARAMETERS_TENSOR) and all(world in (None, 1) for world in worlds):
            return self.not_applicable("a single-process run: there are no replicas to compare")
        return self.not_evaluated(
            "fewer than two ranks wrote replica fingerprints (include 'replica_fingerprints' in "
            "other_workers_collections, or save with include_workers='all')"
        )

    def inapplicable(self) -> str | None:
        self._read_meta()
        if not self.base_trial.has_tensor(PARAMETERS_TENSOR) and all(
            meta.get("world") in (None, 1) for meta in self._meta.values()
        ):
            return "a single-process run: there are no replicas to compare"
        return None

    def _rows(self, tensor: str, step: int) -> dict[str, tuple[list[str], np.ndarray]] | None:
        """{worker: (names, rows)} of ``tensor`` at ``step``, once more workers wrote it than
        were compared there; else None."""
        trial = self.base_trial
        if not trial.has_tensor(tensor):
            return None
        workers = trial.tensor(tensor).workers(step)
        if len(workers) < 2 or len(workers) <= self._compared.get((tensor, step), 0):
            return None
        if len(workers) < self._world() and not self._final:
            return None  # a rank still writing: compared once every rank is there (or at the end)
        found: dict[str, tuple[list[str], np.ndarray]] = {}
        for worker in workers:
            try:
                rows = as_rows(np.asarray(trial.tensor(tensor).value(step, worker=worker), dtype=np.float64))
            except TensorUnavailableForStep:
                continue
            if rows is None:
                continue
            names = self._worker_meta(worker, len(rows)).get("parameters") or []
            found[worker] = (list(names), rows)
        if len(found) < 2:
            return None
        self._compared[(tensor, step)] = len(workers)
        return found

    def _evaluate(self, step: int, evaluated_at: int) -> StepResult | None:
        parameters = self._rows(PARAMETERS_TENSOR, step)
        if parameters is None:
            return None
        self._compared_any = True
        if self._first_step is None or step < self._first_step:
            self._first_step = step
        sharded = {name for meta in self._meta.values() for name in meta.get("sharded") or ()}
        diverged, unjudged = compare_ranks(parameters, sharded=sharded, tolerance=self.tolerance)
        gradient_diverged: list[Disagreement] = []
        gradient_rows = self._rows(GRADIENTS_TENSOR, step) if self.compare_gradients else None
        if gradient_rows is not None:
            gradient_diverged, more = compare_ranks(gradient_rows, sharded=sharded, tolerance=self.tolerance)
            unjudged |= more
        self._unjudged |= unjudged
        unchanged = self._unchanged_ranks(step, parameters, diverged)
        confirmed = False
        for kind, found in (("parameter", diverged), ("gradient", gradient_diverged)):
            for item in found:
                key = (kind, item.name)
                # Fingerprints may be judged out of order (a slower rank's files land late): the
                # first step is the smallest one seen, not the first one judged.
                if key not in self._first or step < self._first[key][0]:
                    self._first[key] = (step, item.odd_ranks)
                self._seen_at.setdefault(key, set()).add(step)
                confirmed = confirmed or len(self._seen_at[key]) >= 2
        details: dict[str, Any] = {"fingerprint_step": step}
        if self._unjudged:
            details["unjudged"] = sorted(self._unjudged)
            details["unjudged_reason"] = "not evaluated: sharded by design or of another size on some rank"
        if not diverged and not gradient_diverged:
            return self.no_issue(evaluated_at, **details)
        return self._finding(evaluated_at, step, diverged, gradient_diverged, gradient_rows, unchanged, confirmed,
                             details)  # fmt: skip

    def _unchanged_ranks(
        self, step: int, parameters: dict[str, tuple[list[str], np.ndarray]], diverged: list[Disagreement]
    ) -> set[int]:
        """Odd ranks whose every divergent parameter kept its hash since their previous fingerprint
        while the reference rank's changed: their optimizer did not step."""
        now = {worker: {name: float(rows[i, HASH]) for i, name in enumerate(names[: len(rows)])}
               for worker, (names, rows) in parameters.items()}  # fmt: skip
        unchanged: set[int] = set()
        for item in diverged:
            for rank in item.odd_ranks:
                if item.reference_rank < 0:
                    continue
                worker, reference = f"worker_{rank}", f"worker_{item.reference_rank}"
                before, before_reference = self._previous.get(worker), self._previous.get(reference)
                if before is None or before_reference is None or item.name not in before[1]:
                    continue
                kept = now[worker].get(item.name) == before[1][item.name]
                moved = now[reference].get(item.name) != before_reference[1].get(item.name)
                if kept and moved:
                    unchanged.add(rank)
        for worker, hashes in now.items():
            self._previous[worker] = (step, hashes)
        return unchanged

    def _finding(
        self,
        evaluated_at: int,
        step: int,
        diverged: list[Disagreement],
        gradient_diverged: list[Disagreement],
        gradient_rows: dict[str, Any] | None,
        unchanged: set[int],
        confirmed: bool,
        details: dict[str, Any],
    ) -> StepResult:
        main = diverged or gradient_diverged
        kind = "parameter" if diverged else "gradient"
        odd = sorted({rank for item in main for rank in item.odd_ranks})
        reference = main[0].reference_rank
        against = f"on {_ranks(odd)} against rank {reference}" if reference >= 0 else (
            f"between {_ranks(odd)} (no majority: which rank is off cannot be told)")
        # every tensor that differs now, parameters and gradients: the confirmation may come from
        # either kind (a parameter left out of DDP shows in its gradients first)
        differing = [("parameter", item) for item in diverged] + [("gradient", item) for item in gradient_diverged]
        first = min(self._first[(which, item.name)][0] for which, item in differing)
        shown = ", ".join(item.name for item in main[:_SHOWN]) + (
            f" and {len(main) - _SHOWN} more" if len(main) > _SHOWN else ""
        )
        example = main[0]
        # enough digits to show one nudged element of a large tensor
        norms = ", ".join(f"rank {rank} {value:.9g}" for rank, value in sorted(example.norms.items()))
        judged = len(gradient_rows[next(iter(gradient_rows))][0]) if gradient_rows else 0
        hint = self._hint(step, odd, diverged, gradient_diverged, judged - len(self._unjudged), unchanged)
        latest = max(max(self._seen_at.get((which, item.name)) or {step}) for which, item in differing)
        message = (
            f"{len(main)} {kind}(s) differ between ranks: {shown} {against}, "
            f"first at step {first} (fingerprint of step {latest}; {example.name} norms at step {step}: {norms})"
        )
        if gradient_diverged and diverged:
            message += f"; the gradients of {len(gradient_diverged)} parameter(s) differ too"
        details.update(
            first_step=first, ranks=odd, reference_rank=reference, tensors=[item.name for item in main],
            kind=kind, gradients_differ=[item.name for item in gradient_diverged],
            optimizer_did_not_step=sorted(unchanged),
        )  # fmt: skip
        return self.issue(evaluated_at, message, fix_hint=hint, certain=confirmed, **details)

    def _hint(
        self,
        step: int,
        odd: list[int],
        diverged: list[Disagreement],
        gradient_diverged: list[Disagreement],
        judged_gradients: int,
        unchanged: set[int],
    ) -> str:
        who = _ranks(odd)
        if gradient_diverged and len(gradient_diverged) < judged_gradients:
            names = ", ".join(item.name for item in gradient_diverged[:_SHOWN])
            return (
                f"The gradients of {names} are not all-reduced: those parameters are outside the module "
                "DistributedDataParallel wraps (or DDP ignores them). Make them part of the wrapped module, "
                "or all-reduce their gradients yourself."
            )
        if gradient_diverged:
            return (
                f"No gradient is all-reduced on {who}: a no_sync() context is never left (only the micro-batches "
                "before the syncing one belong in it) or the model is not wrapped in DistributedDataParallel. "
                f"Or {who} skipped an optimizer.step() (a condition on the rank's own loss, a GradScaler skip): "
                "its steps then lag behind the others'."
            )
        if unchanged:
            return (
                f"The optimizer of {_ranks(unchanged)} did not step while the others did (a condition on that "
                "rank's own loss or gradients, a GradScaler skip on one rank): decide such skips on values "
                "all-reduced first, so every rank takes the same branch."
            )
        if (
            self._first_step is not None
            and min(self._first[("parameter", item.name)][0] for item in diverged) <= self._first_step
        ):
            return (
                f"The ranks hold different values from the first fingerprint on while their gradients agree: "
                f"{who} started from other initial values (seeded per rank, never broadcast). Wrap the model in "
                "DistributedDataParallel (it broadcasts rank 0's values) or seed every rank alike, or "
                "dist.broadcast each parameter from rank 0 before training."
            )
        return (
            f"The gradients agree but the values of {who} do not: something changed that rank's parameters "
            "outside the all-reduced update (an in-place edit on one rank, an optimizer step skipped or taken "
            "twice there, a per-rank learning rate, a buffer not broadcast that feeds a parameter)."
        )
