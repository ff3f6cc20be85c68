"""TreeDepth: an XGBoost tree grew deeper than ``depth``.

Formula, at each step with tensors of the ``trees`` collection (``trees/<column>``):

    fire if D > depth, where D is the largest tree depth among the trees saved at the step

D comes from the best information the run holds:

1. ``trees/Depth`` (trainguard's XGBoost hook saves each node's depth): its maximum;
2. ``trees/Tree``, ``trees/Node``, ``trees/Yes``, ``trees/No`` as numbers: the depth found by
   walking the child links of each tree;
3. only ``trees/Node`` (smdebug runs; string node ids are not usable): SageMaker's documented
   estimate from the largest node id, here ``ceil(log2(max_id + 2)) - 1``. XGBoost numbers
   nodes in creation order, so a tree of depth D has ids < 2^(D+1) - 1 and this is a lower
   bound of the true depth, exact for full trees (SageMaker's plain ``log2(max id)`` would
   call a full depth-4 tree 4.9 deep and fire at ``depth=4``).

Calibrated default: ``depth`` 6 (documented 4). XGBoost's own default ``max_depth`` is 6, so
with the documented value every run with XGBoost's defaults fires; 6 flags trees deeper than
XGBoost would grow unless told to.
"""

from __future__ import annotations

import math

import numpy as np

from trainguard.rules.base import MissingTensor, Rule, StepResult
from trainguard.rules.builtin._losses import is_complete, read_values
from trainguard.rules.params import Param

_PREFIX = "trees/"


def depth_from_links(tree: np.ndarray, node: np.ndarray, yes: np.ndarray, no: np.ndarray) -> int:
    """The largest depth (root = 0) over the trees described by child links (-1/NaN: a leaf)."""
    deepest = 0
    for tree_id in np.unique(tree[np.isfinite(tree)]):
        rows = tree == tree_id
        children: dict[int, list[int]] = {}
        for parent, left, right in zip(node[rows], yes[rows], no[rows], strict=False):
            links = [int(child) for child in (left, right) if np.isfinite(child) and child >= 0]
            if links:
                children[int(parent)] = links
        level, frontier, seen = 0, [0], {0}
        while frontier:
            following = []
            for parent in frontier:
                for child in children.get(parent, ()):
                    if child not in seen:  # a corrupt cycle must not loop forever
                        seen.add(child)
                        following.append(child)
            if not following:
                break
            level += 1
            frontier = following
        deepest = max(deepest, level)
    return deepest


def depth_from_node_ids(node: np.ndarray) -> int:
    finite = node[np.isfinite(node)]
    if finite.size == 0:
        return 0
    return max(0, math.ceil(math.log2(float(finite.max()) + 2)) - 1)


class TreeDepth(Rule):
    """XGBoost trees deeper than a limit: prone to over-fitting the training data."""

    rule_name = "TreeDepth"
    collections = ("trees",)
    frameworks = ("xgboost",)  # the collections exist only in XGBoost captures
    fix_hint = (
        "cap the tree depth: set max_depth (e.g. 6 or less), or constrain growth with min_child_weight, "
        "gamma (min_split_loss) or max_leaves"
    )

    depth = Param(int, 6, "fire when a tree is deeper than this", documented_default=4,
                  check=lambda value: None if value >= 0 else "must be >= 0")

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        known = trial.collections()
        names = set(trial.tensor_names(step=step, regex=[f"^{_PREFIX}"]))
        if "trees" in known:
            names.update(trial.tensor_names(step=step, collection="trees"))
        if not names:
            if trial.training_ended and not trial.tensor_names(regex=[f"^{_PREFIX}"]):
                framework = self.framework()
                if framework not in (None, "xgboost"):  # in a default set beside a PyTorch/Keras run
                    return self.not_applicable(f"applies to XGBoost models only; this is a {framework} run", step)
                return self.missing(step, MissingTensor("trees (XGBoost tree model)", "trees"))
            return None
        values = {}
        for name, value in read_values(trial, sorted(names), step).items():
            array = np.asarray(value)
            if array.dtype.kind in "fiub":
                values[name.rsplit("/", 1)[-1]] = array.astype(np.float64).reshape(-1)
        deepest, method = self._depth(values)
        if deepest is None:
            return None
        details = {"max_depth": deepest, "method": method, "depth": self.depth}
        if deepest > self.depth:
            return self.issue(step, f"a tree is {deepest} levels deep (> depth {self.depth}; {method})", **details)
        return self.no_issue(step, **details)

    @staticmethod
    def _depth(columns: dict[str, np.ndarray]) -> tuple[int | None, str]:
        if "Depth" in columns and columns["Depth"].size:
            finite = columns["Depth"][np.isfinite(columns["Depth"])]
            if finite.size:
                return int(finite.max()), "saved node depths"
        needed = ("Tree", "Node", "Yes", "No")
        if all(key in columns for key in needed) and len({columns[key].size for key in needed}) == 1:
            return depth_from_links(*(columns[key] for key in needed)), "tree links"
        if "Node" in columns and columns["Node"].size:
            return depth_from_node_ids(columns["Node"]), "estimated from the largest node id"
        return None, ""
