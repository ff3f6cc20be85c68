"""Loads the sweep examples (examples/sweeps/) as modules, and what the sweep tests expect of them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sweeps"
# The rules that may stop each bad configuration first (a learning rate far too high makes the
# updates explode before the values turn NaN); the good ones must never be stopped.
EXPECTED_RULES = {
    "lr-far-too-high": {"ExplodingTensor", "WeightUpdateRatio", "LossNotDecreasing"},
    "saturated-init": {"SaturatedActivation", "VanishingGradient", "PoorWeightInitialization"},
}
GOOD = ("good-lr-0.01", "good-lr-0.003")


def load_example(name: str) -> ModuleType:
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"sweep_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
