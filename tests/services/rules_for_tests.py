"""A small custom rule the service tests name as ``tests.services.rules_for_tests:LossAboveThreshold``.

A custom rule given by ``module:Class`` path is how users plug in their own rules; the tests use
one so that they do not depend on the calibration of a particular built-in rule.
"""

from __future__ import annotations

import math

import numpy as np

from trainguard.rules import Param, Rule, StepResult


class LossAboveThreshold(Rule):
    """Fires when a saved loss is above ``threshold`` or not finite."""

    rule_name = "LossAboveThreshold"
    fix_hint = "The loss blew up: lower the learning rate or clip gradients."
    collections = ("losses",)
    threshold = Param(float, 100.0, "largest acceptable loss")
    # A hard threshold the user chose: crossing it is certain by definition, so it may stop a job
    # (uncertain findings never do; see StepResult.certain).
    stop_policy = "stops training when a saved loss is above threshold or not finite"

    def check(self, step: int) -> StepResult | None:
        names = self.select_tensors(collection_names=["losses"], step=step)
        if not names:
            return None
        for name in names:
            value = float(np.mean(self.base_trial.tensor(name).value(step)))
            if not math.isfinite(value) or value > self.threshold:
                return self.issue(step, f"{name} = {value:g} exceeds {self.threshold:g}", certain=True, loss=value)
        return self.no_issue(step)
