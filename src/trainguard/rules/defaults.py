"""The rules ``trainguard run --rules`` uses when none are named, and the hook config they need.

The default set holds the deep-learning rules whose trainguard defaults are calibrated to stay
silent on healthy training (see each rule's docstring) while catching the common faults: a
learning rate that makes training explode, vanishing gradients, a loss that stops decreasing,
dead or saturated activations, weight updates far too large or too small, bad initialisation and
overfitting; the data rules (unnormalised inputs and images, imbalanced classes, padded token
sequences), the XGBoost rules (tree depth, one feature doing all the work), probabilities handed
to a cross-entropy loss (a Softmax before it) and, for distributed
runs, ReplicaDivergence (ranks whose replicas differ; not applicable to one process). A rule whose data a
run does not have (XGBoost rules on a PyTorch run, Overfit without validation) reports "not
evaluated" and does not make ``trainguard run`` fail; only rules named explicitly do. Every rule
here is silent on the healthy runs of the detection corpus (docs/rules-calibration.md). Rules not
installed (yet) are left out, so the set works with whatever ``builtin_rules()`` holds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

from trainguard.config.capture_config import ZERO_CODE_SAVE_INTERVAL
from trainguard.errors import ConfigError
from trainguard.rules.spec import RuleSpec

__all__ = [
    "DEFAULT_RULES", "DEFAULT_RULE_COLLECTIONS", "default_rule_specs", "hook_config_for_rules", "rule_collections",
]  # fmt: skip

DEFAULT_RULES: tuple[str, ...] = (
    "ExplodingTensor",
    "VanishingGradient",
    "LossNotDecreasing",
    "DeadRelu",
    "SaturatedActivation",
    "WeightUpdateRatio",
    "PoorWeightInitialization",
    "Overfit",
    "Overtraining",
    "NotNormalizedData",
    "CheckInputImages",
    "ClassImbalance",
    "NLPSequenceRatio",
    "TreeDepth",
    "FeatureImportanceOverweight",
    # a Softmax before CrossEntropyLoss: a configuration fact no learning-symptom rule can name
    "ProbabilitiesIntoCrossEntropy",
    # compares the ranks of a distributed run; a single-process run is not applicable
    "ReplicaDivergence",
)
# What the rules of DEFAULT_RULES read: ``rule_collections`` of their classes, spelt out so that
# ``trainguard run`` without --rules can save them without importing every rule (and numpy)
# before the training starts; tests/hooks/test_capture_for_later.py checks the two agree.
# Saved by every ``trainguard run`` without --config, so that ``trainguard rules run`` can
# judge the run later (SaturatedActivation's tanh inputs, the data rules' model inputs and labels).
DEFAULT_RULE_COLLECTIONS: tuple[str, ...] = (
    "gradients", "losses", "relu_output", "tanh_input", "sigmoid_input", "weights", "relu_input",
    "model_inputs", "labels", "predictions", "trees", "feature_importance", "replica_fingerprints",
)  # fmt: skip
# What zero-code capture saves when no config is given; kept when rules add their collections.
BASE_COLLECTIONS: tuple[str, ...] = (
    "weights", "biases", "gradients", "losses", "outputs", "scalars", "default", "replica_fingerprints",
)  # fmt: skip


def default_rule_specs() -> list[RuleSpec]:
    from trainguard.rules import builtin_rules

    available = builtin_rules()
    return [RuleSpec(name) for name in DEFAULT_RULES if name in available]


def rule_collections(rule_classes: Iterable[type], framework: str | None = None) -> list[str]:
    """Collections the debugger rules among ``rule_classes`` need the hook to save, in order.

    With ``framework`` ("pytorch", "keras", "xgboost"), rules that declare other ``frameworks``
    (TreeDepth's ``trees`` exist only in XGBoost captures) add nothing: a framework's hook
    refuses collections it does not know.
    """
    needed: list[str] = []
    for rule_class in rule_classes:
        if getattr(rule_class, "kind", "debugger") != "debugger":
            continue
        frameworks = getattr(rule_class, "frameworks", None)
        if framework is not None and frameworks is not None and framework not in frameworks:
            continue
        for name in getattr(rule_class, "collections", ()) or ():
            if name not in needed:
                needed.append(name)
    return needed


def hook_config_for_rules(
    collections: Sequence[str], *, base_config: str | os.PathLike[str] | None = None, save_interval: int | None = None
) -> dict[str, Any]:
    """A DebugHookConfig document that saves ``collections`` on top of the user's config.

    Without ``base_config`` it reproduces zero-code capture's defaults (``BASE_COLLECTIONS``
    every ``save_interval`` steps, default ``ZERO_CODE_SAVE_INTERVAL``); with it, the user's document is kept as is and
    the rules' collections are added to its ``CollectionConfigurations`` (an entry without
    parameters changes nothing about a collection the user configured).
    """
    if base_config:
        try:
            with open(base_config, encoding="utf-8") as file:
                document = json.load(file)
        except FileNotFoundError:
            raise ConfigError(f"--config {base_config} does not exist") from None
        except json.JSONDecodeError as error:
            raise ConfigError(f"--config {base_config} is not valid JSON: {error}") from None
        if not isinstance(document, dict):
            raise ConfigError(f"--config {base_config} must hold a JSON object (SageMaker's DebugHookConfig)")
    else:
        interval = ZERO_CODE_SAVE_INTERVAL if save_interval is None else int(save_interval)
        if interval <= 0:
            raise ConfigError(f"--save-interval {save_interval} must be a positive number of steps")
        document = {
            "HookParameters": {"save_interval": str(interval)},
            "CollectionConfigurations": [{"CollectionName": name} for name in BASE_COLLECTIONS],
        }
    entries = list(document.get("CollectionConfigurations") or [])
    present = {entry.get("CollectionName") for entry in entries if isinstance(entry, dict)}
    entries.extend({"CollectionName": name} for name in collections if name not in present)
    document["CollectionConfigurations"] = entries
    return document
