"""Peak RSS and CPU of ONE rule-runner process (the Ray launcher's rules group) evaluating N rules
over one finished local run: how a group's cost grows with its rules.

Captures a 100-step run of tests/services/train_script.py once (``trainguard run``), then for each
N runs ``python -m trainguard.services.rule_runner`` in group mode (TRAINGUARD_RULE_GROUP_JSON, N
copies of the tests' LossAboveThreshold, no API) in a fresh wrapper process whose only child it is,
and prints the child's peak RSS (getrusage) and CPU seconds.

    python bench/rule_group_rss.py 1 5 20
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_MEASURE = """
import resource, subprocess, sys
subprocess.run([sys.executable, "-m", "trainguard.services.rule_runner"], check=True, stdout=subprocess.DEVNULL,
               stderr=subprocess.DEVNULL)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(usage.ru_maxrss, usage.ru_utime + usage.ru_stime)
"""


def main(counts: list[int]) -> int:
    work = Path(tempfile.mkdtemp(prefix="tg-group-rss-"))
    run = work / "debug-output"
    config = work / "hook.json"
    config.write_text(json.dumps({"HookParameters": {"save_interval": "1"}, "LocalPath": str(run)}))
    subprocess.run([sys.executable, "-m", "trainguard.cli", "run", "--out", str(run), "--config", str(config), "--",
                    sys.executable, str(REPO / "tests" / "services" / "train_script.py"), "--steps", "100"],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    print(f"{'rules':>5} {'peak RSS MiB':>12} {'CPU s':>6}")
    for count in counts:
        entries = [{"role": f"rule:L{i}", "environment": {"RULE_CONFIGURATION_NAME": f"L{i}",
                    "RULE_PARAMETERS_JSON": json.dumps({"threshold": 1000 + i})}} for i in range(count)]  # fmt: skip
        environment = {**os.environ, "PYTHONPATH": str(REPO), "TRAINING_JOB_NAME": "rss", "BASE_TRIAL": str(run),
                       "RULE_TO_INVOKE": "tests.services.rules_for_tests:LossAboveThreshold",
                       "RULE_OUTPUT_DIR": str(work / f"out-{count}"),
                       "TRAINGUARD_RULE_GROUP_JSON": json.dumps(entries)}  # fmt: skip
        output = subprocess.run([sys.executable, "-c", _MEASURE], env=environment, check=True, capture_output=True,
                                text=True).stdout.split()  # fmt: skip
        print(f"{count:>5} {int(output[0]) / 1024:>12.1f} {float(output[1]):>6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main([int(value) for value in sys.argv[1:]] or [1, 5, 20]))
