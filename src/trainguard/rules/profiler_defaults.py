"""The profiler rules ``trainguard run --profile --rules`` adds to the default set.

SageMaker's ProfilerReport runs these ten on every profiled job; ``trainguard run --profile``
runs them live beside the debugger rules, on the profiler data the run writes
(``profiler-output/``). A rule whose data a run cannot have says so instead of passing: the GPU
rules on a machine without a GPU end "not evaluated" with the reason, StepOutlier under its
minimum number of steps too. None of them fires on the healthy CPU loops of
``tests/profiler/test_live_rules.py``.

Which of their findings may stop training (``--stop-on-issue``): only a confirmed input stall
(Dataloader, see its docstring); the others report only (a slow step, an idle GPU or a busy CPU
are costs, not a broken training).
"""

from __future__ import annotations

from trainguard.rules.spec import RuleSpec

__all__ = ["DEFAULT_PROFILER_RULES", "default_profiler_rule_specs"]

DEFAULT_PROFILER_RULES: tuple[str, ...] = (
    "StepOutlier",
    "Dataloader",
    "CPUBottleneck",
    "IOBottleneck",
    "LowGPUUtilization",
    "GPUMemoryIncrease",
    "BatchSize",
    "LoadBalancing",
    "MaxInitializationTime",
    "OverallSystemUsage",
)


def default_profiler_rule_specs() -> list[RuleSpec]:
    """The installed rules of :data:`DEFAULT_PROFILER_RULES`, in that order."""
    from trainguard.rules import builtin_rules

    available = builtin_rules()
    return [RuleSpec(name) for name in DEFAULT_PROFILER_RULES if name in available]
