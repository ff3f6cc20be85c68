"""Rule-output and profiler-output files for the report tests, in the formats the runners write.

Rule results are built from real :class:`StepResult` objects (``to_dict``), the way the rule
runner serialises them. Profiler files follow SageMaker's layouts (keys from
:mod:`trainguard.profiler.layout`): system-metric JSON lines and a Chrome-trace timeline.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from trainguard.profiler import layout
from trainguard.rules.base import MissingTensor, Rule, StepResult

VANISHING_HINT = "Use ReLU-family activations, residual connections or better initialisation; check the learning rate."
OVERFIT_HINT = "Add regularisation (dropout, weight decay) or stop earlier."
START_EPOCH_S = 1_763_000_010  # a fixed time, so the files and their keys are stable
SAMPLE_INTERVAL_S = 0.5
SAMPLES = 150  # 75 s of samples: two minute files


class _Fixture(Rule):
    """A rule class used only to build StepResults through the real builders."""

    rule_name = "VanishingGradient"
    fix_hint = VANISHING_HINT
    collections = ("gradients",)


def rule_output_files(run_dir: Path) -> dict[str, dict]:
    """Write three rule results (issues found, no issues, error with missing data); return them."""
    rule = _Fixture(None)
    fired = [
        rule.issue(4, "gradient/Net_fc1.weight mean |g| 3.1e-08 < threshold 1e-07", tensor="gradient/Net_fc1.weight"),
        rule.issue(12, "gradient/Net_fc2.weight mean |g| 2.0e-08 < threshold 1e-07", tensor="gradient/Net_fc2.weight"),
    ]
    quiet = rule.no_issue(2)
    overfit = StepResult(
        "Overfit", 30, True, "validation loss 0.91 rose 25% above training loss 0.73", OVERFIT_HINT, {"ratio": 1.25}
    )
    missing = rule.missing(0, MissingTensor("tensors of collection 'relu_output'", "relu_output"))
    outputs = {
        "VanishingGradient": {
            "configuration_name": "VanishingGradient",
            "rule": "VanishingGradient",
            "status": "IssuesFound",
            "status_details": fired[0].condition_met_details(),
            "last_evaluated_step": 40,
            "findings": [quiet.to_dict()] + [result.to_dict() for result in fired],
            "missing": [],
            "updated_at": START_EPOCH_S + 80.0,
        },
        "Overfit-eval": {
            "configuration_name": "Overfit-eval",
            "rule": "Overfit",
            "status": "IssuesFound",
            "status_details": overfit.condition_met_details(),
            "last_evaluated_step": 40,
            "findings": [overfit.to_dict()],
            "missing": [],
            "updated_at": START_EPOCH_S + 81.0,
        },
        "LossNotDecreasing": {
            "configuration_name": "LossNotDecreasing",
            "rule": "LossNotDecreasing",
            "status": "NoIssuesFound",
            "status_details": "",
            "last_evaluated_step": 40,
            "findings": [],
            "missing": [],
            "updated_at": START_EPOCH_S + 82.0,
        },
        "DeadRelu": {
            "configuration_name": "DeadRelu",
            "rule": "DeadRelu",
            "status": "Error",
            "status_details": "InsufficientInformation: the run saved no ReLU outputs",
            "last_evaluated_step": None,
            "findings": [missing.to_dict()],
            "missing": [{"what": "tensors of collection 'relu_output'", "collection": "relu_output"}],
            "updated_at": START_EPOCH_S + 83.0,
        },
    }
    folder = run_dir / "rule-output"
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in outputs.items():
        (folder / f"{name}.json").write_text(json.dumps(content, indent=1))
    return outputs


def system_samples() -> list[dict]:
    """The system-metric records the fixture writes: 2 cores, memory, I/O wait, one GPU."""
    records = []
    for index in range(SAMPLES):
        timestamp = START_EPOCH_S + index * SAMPLE_INTERVAL_S
        wave = math.sin(index / 9)
        values = [
            ("cpu", "cpu0", layout.CPU_UTILIZATION, 55 + 30 * wave),
            ("cpu", "cpu1", layout.CPU_UTILIZATION, 35 + 20 * math.cos(index / 7)),
            ("cpu", "cpu0", layout.IO_WAIT, 4 + 3 * wave),
            ("cpu", "cpu1", layout.IO_WAIT, 2 + 2 * math.cos(index / 5)),
            ("cpu", "MemoryUsedPercent", layout.MEMORY_ALGORITHM, 30 + index * 0.1),
            ("gpu", "gpu0", layout.GPU_UTILIZATION, 70 + 25 * math.sin(index / 4)),
            ("gpu", "gpu0", layout.GPU_MEMORY_UTILIZATION, 40 + index * 0.05),
        ]
        for kind, name, dimension, value in values:
            records.append(
                {
                    "Type": kind,
                    "Name": name,
                    "Dimension": dimension,
                    "Value": round(value, 3),
                    "NodeId": "algo-1",
                    "Timestamp": timestamp,
                }
            )
    return records


def step_events(start_us: int) -> list[dict]:
    """Chrome-trace events: 30 TRAIN steps then 12 EVAL steps, durations that vary by step."""
    events = [
        {
            "name": "process_name",
            "ph": "M",
            "pid": 0,
            "args": {"name": "Step:ModeKeys.TRAIN", "start_time_since_epoch_in_micros": start_us},
        }
    ]
    ts = 0
    for mode, count, base_us in (("TRAIN", 30, 40_000), ("EVAL", 12, 15_000)):
        for step in range(count):
            duration = base_us + (step % 5) * 2_000 + (25_000 if step == 7 else 0)
            events.append(
                {
                    "name": f"Step:ModeKeys.{mode}",
                    "ph": "X",
                    "ts": ts,
                    "dur": duration,
                    "pid": 0,
                    "tid": 1,
                    "args": {"step_num": step},
                }
            )
            ts += duration + 500
    return events


def profiler_output_files(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """Write the system-metric files (one per minute) and one timeline file; return what was written."""
    root = run_dir / layout.PROFILER_DIR
    records = system_samples()
    by_minute: dict[int, list[dict]] = {}
    for record in records:
        by_minute.setdefault(int(record["Timestamp"]) // 60 * 60, []).append(record)
    for minute, items in by_minute.items():
        path = root / layout.system_key(minute, "algo-1")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(item) + "\n" for item in items))
    start_us = START_EPOCH_S * 1_000_000
    events = step_events(start_us)
    end_us = start_us + max(e.get("ts", 0) + e.get("dur", 0) for e in events)
    path = root / layout.framework_key(end_us, 0, "algo-1")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(events))
    return records, events
