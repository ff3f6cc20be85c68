"""SimilarAcrossRuns: at each step s present in the base trial and another trial, fire if any inspected
tensor present in both is not ``np.allclose(base_s, other_s, rtol, atol)``.

SageMaker ``rule_to_invoke``: ``SimilarAcrossRuns``; parameters ``other_trials`` (required: the
SDK sends ``other_trial_0`` … ``other_trial_N``, earlier docs ``other_trial``; trainguard accepts
all three forms as paths, comma-separated lists too, or trial objects passed as
``other_trials=``), ``collection_names`` and ``tensor_regex`` (every common tensor when neither
is given). ``rtol``/``atol`` (np.allclose's defaults) are trainguard additions. Steps are
matched by global step number.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from trainguard.errors import ConfigError
from trainguard.rules.base import Rule, StepResult
from trainguard.rules.builtin._helpers import check_regexes, fmt, is_complete, names_at, read_values, select
from trainguard.rules.params import Param, parse_list

_OTHER_TRIAL_KEY = re.compile(r"^other_trials?(_\d+)?$")


class SimilarAcrossRuns(Rule):
    """Tensors that differ between this run and another run at the same step."""

    rule_name = "SimilarAcrossRuns"
    fix_hint = "for reproducible runs fix every random seed; otherwise compare the runs' configurations"
    fix_hints = {
        "pytorch": (
            "for reproducible runs fix every seed (torch.manual_seed, numpy, random, DataLoader workers) and "
            "use torch.use_deterministic_algorithms(True); otherwise compare the runs' configurations"
        ),
        "keras": (
            "for reproducible runs call keras.utils.set_random_seed(seed) and enable "
            "tf.config.experimental.enable_op_determinism(); otherwise compare the runs' configurations"
        ),
        "xgboost": "for reproducible runs set seed and nthread; otherwise compare the runs' configurations",
    }

    collection_names = Param(list, None, "collections to compare")
    tensor_regex = Param(list, None, "regexes of tensor names to compare")
    rtol = Param(float, 1e-5, "np.allclose rtol (trainguard)")
    atol = Param(float, 1e-8, "np.allclose atol (trainguard)")

    def __init__(self, base_trial: Any, *, other_trials: Any = (), **parameters: Any) -> None:
        paths: list[Any] = []
        for key in sorted(parameters):
            if _OTHER_TRIAL_KEY.match(key):
                value = parameters.pop(key)
                paths.extend(parse_list(value) if isinstance(value, str) else list(value))
        if isinstance(other_trials, str):
            other_trials = parse_list(other_trials)
        super().__init__(base_trial, other_trials=[*list(other_trials), *paths], **parameters)
        if not self.other_trials:
            raise ConfigError(
                f"{self.name()}: needs other_trials (the other run's path, e.g. other_trial_0=s3://bucket/run2)"
            )
        self.other_trials = [self._open(item) for item in self.other_trials]

    @staticmethod
    def _open(item: Any) -> Any:
        if isinstance(item, str):
            from trainguard.trial import create_trial

            return create_trial(item)
        return item

    def validate(self) -> None:
        check_regexes(self, "tensor_regex")

    def check(self, step: int) -> StepResult | None:
        if not is_complete(self.base_trial, step):
            return None
        if self.collection_names or self.tensor_regex:
            names = select(self, step, collections=self.collection_names, regex=self.tensor_regex)
        else:
            names = names_at(self.base_trial, step)
        if not names:
            return None
        base = None
        compared = 0
        for other in self.other_trials:
            if not is_complete(other, step):
                continue
            common = sorted(set(names) & set(names_at(other, step)))
            if not common:
                continue
            base = base or read_values(self.base_trial, names, step)
            theirs = read_values(other, common, step)
            differing: dict[str, float] = {}
            for name in common:
                if name not in base or name not in theirs:
                    continue
                compared += 1
                a, b = np.asarray(base[name]), np.asarray(theirs[name])
                if a.shape != b.shape:
                    differing[name] = float("inf")
                elif not np.allclose(a, b, rtol=self.rtol, atol=self.atol, equal_nan=True):
                    with np.errstate(all="ignore"):
                        differing[name] = float(np.nanmax(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            if differing:
                name = sorted(differing)[0]
                return self.issue(
                    step,
                    f"{len(differing)} tensor(s) differ from run {getattr(other, 'path', other)} at step {step}, e.g. "
                    f"{name} (max |difference| {fmt(differing[name])})",
                    tensor=name,
                    other_trial=str(getattr(other, "path", other)),
                    max_abs_difference=differing,
                )
        if compared == 0:
            return None
        return self.no_issue(step, tensors_compared=compared)
