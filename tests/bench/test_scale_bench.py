"""bench/scale.py must keep working: its tiny mode (2 jobs x 2 rules) on a real local Ray cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("ray.cluster_utils", reason="bench/scale.py starts a Ray cluster: pip install -e '.[ray]'")
pytest.importorskip("moto.server", reason="bench/scale.py starts a moto S3 server: pip install -e '.[test]'")

pytestmark = pytest.mark.slow


def test_scale_tiny_mode_stops_the_faulty_job_and_measures_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    completed = subprocess.run([sys.executable, str(REPO / "bench" / "scale.py"), "--tiny", "--timeout", "240",
                                "--json", str(out)], cwd=REPO, timeout=420, capture_output=True, text=True)  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert (figures["jobs"], figures["rules_per_job"], figures["faulty_jobs"]) == (2, 2, 1)
    # The faulty job is found by its rule and stopped through Ray; the healthy one completes.
    assert figures["final_statuses"] == {"Stopped": 1, "Completed": 1}
    assert figures["faulty_stopped"] == 1 and figures["detection_to_stopped_s"]["n"] == 1
    assert 0 <= figures["detection_to_stopped_s"]["p95"] < 60
    assert figures["submit_to_running_s"]["n"] == 2 and figures["submit_to_running_s"]["p50"] > 0
    # Every cost the paper estimate scales from was measured, not defaulted.
    # One rule-runner process per job on Ray (the job's rules group), not one per rule.
    assert figures["rule_runner_processes"] == 2 and figures["rules_per_runner_process"] == 2
    assert figures["rule_runner_peak_rss_mib"]["median"] > 20
    assert figures["api_peak_rss_mib"] > 30
    assert figures["rule_steps_evaluated"] > 0 and figures["rule_runner_cpu_ms_per_evaluated_step"] > 0
    assert figures["saved_steps"] > 0 and figures["s3_requests"].get("PUT", 0) > 0
    assert figures["s3_writes_per_saved_step"] > 0 and figures["s3_reads_per_saved_step_per_rule"] > 0
    assert figures["s3_reads_per_saved_step"] > 0
    assert figures["db"]["commits"] > 0 and figures["db_commits_per_job_minute"] > 0
    estimate = {row[0]: row for row in figures["paper_estimate"]}
    assert {"rule-runner CPU", "rule-runner memory", "S3 writes", "S3 reads", "API DB commits"} <= set(estimate)
    assert "100 x 20 needs" in completed.stdout  # the table is printed
