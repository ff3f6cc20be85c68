"""Each public package's ``__all__`` pinned (as httpx's tests/test_exported_members.py does): a
name added to or dropped from the public API is a decision this file records, not a side effect
of an import shuffled in a refactoring. Every exported name resolves, lists are sorted, and a
class or function a package defines itself is exported or private (``_name``)."""

from __future__ import annotations

import importlib
import inspect
import os

import pytest

_HOOK_FACE = ["Collection", "CollectionManager", "Hook", "ModeKeys", "ReductionConfig", "SaveConfig", "SaveConfigMode"]

PINNED: dict[str, list[str]] = {
    "trainguard": ["ConfigError", "FormatError", "ModeKeys", "StorageError", "TrainguardError", "TrialError", "modes"],
    "trainguard.config": ["CaptureConfig", "Collection", "CollectionManager", "ReductionConfig", "SaveConfig", "SaveConfigMode"],
    "trainguard.errors": [
        "ChecksumMissing", "ConfigError", "FormatError", "InvalidWorker", "MissingCollectionFiles",
        "MissingDependencyError", "NoMoreData", "ObjectNotFound", "StepNotYetAvailable", "StepUnavailable",
        "StorageError", "TensorUnavailable", "TensorUnavailableForStep", "TrainguardError", "TrialError",
        "WaitTimeout",
    ],
    "trainguard.format": [
        "DecodedTensor", "EncodedTensor", "IndexEntry", "StepIndex", "declares_payload_checksums", "decode_event",
        "encode_tensor_event", "frame", "iter_records", "parse_index", "parse_record", "render_index", "saved_dtype",
    ],
    "trainguard.modes": ["ModeKeys", "modes"],
    "trainguard.profiler": [
        "MIN_INTERVAL_MS", "Profiler", "StepTiming", "StepTimingReader", "SystemMetric", "SystemMetricsReader",
        "locate_profiler_output", "metric_series", "read_step_timings", "read_system_metrics",
        "start_from_environment",
    ],
    "trainguard.report": ["ReportData", "ReportPage", "build_page", "gather_report", "write_report"],
    "trainguard.rules": [
        "MissingTensor", "Param", "Rule", "RuleSpec", "RuleStatus", "StepResult", "builtin_rules", "create_rule",
        "get_rule_class", "rule_names",
    ],
    "trainguard.statuses": ["JOB_STATUSES", "JOB_TERMINAL", "JobStatus", "RULE_STATUSES", "RULE_TERMINAL", "RuleStatus"],
    "trainguard.storage": [
        "Buffer", "LocalStore", "MemoryStore", "Store", "StoreWriter", "is_remote", "open_store",
        "require_local_path", "sidecar_root",
    ],
    "trainguard.trial": ["StepState", "Tensor", "Trial", "create_trial"],
    "trainguard.trials": ["StepState", "Tensor", "Trial", "create_trial"],
    "trainguard.ui": ["Dashboard", "PathRuns", "UiServer", "serve_paths"],
    "trainguard.writer": [],
    # smdebug's framework faces: `import trainguard.pytorch as smd` finds what `smdebug.pytorch` had
    "trainguard.pytorch": sorted([*_HOOK_FACE, "get_hook", "modes"]),
    "trainguard.keras": sorted([*_HOOK_FACE, "KerasHook", "get_hook", "modes"]),
    "trainguard.xgboost": sorted([*_HOOK_FACE, "modes"]),
}  # fmt: skip


def _module(name: str, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    if name == "trainguard.keras" and "KERAS_BACKEND" not in os.environ:
        monkeypatch.setenv("KERAS_BACKEND", "torch")  # as tests/keras: no TensorFlow here
    return importlib.import_module(name)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_exported_members_are_pinned(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module(name, monkeypatch)
    assert list(module.__all__) == PINNED[name]
    assert list(module.__all__) == sorted(module.__all__)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_every_exported_member_resolves(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module(name, monkeypatch)
    missing = [member for member in module.__all__ if getattr(module, member, None) is None]
    assert missing == []


@pytest.mark.parametrize("name", sorted(PINNED))
def test_what_a_package_defines_is_exported_or_private(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module(name, monkeypatch)
    defined_here = [
        member
        for member, value in vars(module).items()
        if not member.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__ == module.__name__
    ]
    assert sorted(set(defined_here) - set(module.__all__)) == []
