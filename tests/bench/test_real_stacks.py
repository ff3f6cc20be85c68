"""bench/real_stacks.py must keep working: one stack, its three variants, at 1 % of its steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_real_stacks_quick_mode_measures_every_variant(tmp_path: Path) -> None:
    out = tmp_path / "stacks.json"
    subprocess.run([sys.executable, str(REPO / "bench" / "real_stacks.py"), "--quick", "--stacks", "mlp",
                    "--load", "no", "--json", str(out)], check=True, cwd=REPO, timeout=600)  # fmt: skip
    document = json.loads(out.read_text())
    variants = {row["variant"]: row for row in document["table"]}
    assert set(variants) == {"plain", "trainguard", "trainguard_rules"}
    assert variants["plain"]["loop_ratio"] == 1.0
    for row in variants.values():
        assert row["loop_s"] > 0 and row["command_s"] > row["loop_s"] and row["peak_rss_mib"] > 50


def test_several_plain_copies_make_the_baseline_their_mean() -> None:
    sys.path.insert(0, str(REPO))
    from bench.real_stacks import command, plain_copies, summarise

    assert plain_copies(3) == ("plain", "plain_2", "plain_3")
    assert command("mlp", "plain_2", 1.0) == command("mlp", "plain", 1.0)  # the same script, not trainguard
    rows = []
    for rep, (first, second, hooked) in enumerate([(10.0, 12.0, 12.1), (9.0, 9.0, 9.9)]):
        for variant, seconds in (("plain", first), ("plain_2", second), ("trainguard", hooked)):
            rows.append({"condition": "quiet", "rep": rep, "stack": "mlp", "variant": variant, "loop_s": seconds,
                         "command_s": seconds + 5, "peak_rss_mib": 300.0})  # fmt: skip
    table = {row["variant"]: row for row in summarise(rows)}
    # repetition 0: baseline 11.0 -> 1.1; repetition 1: baseline 9.0 -> 1.1 (against plain alone: 1.21 and 1.1)
    assert abs(table["trainguard"]["loop_ratio"] - 1.1) < 1e-9
    assert abs(table["trainguard"]["loop_ratio_max"] - 1.1) < 1e-9
    assert abs(table["plain_2"]["loop_ratio_max"] - 12.0 / 11.0) < 1e-9  # the spread of identical processes
    assert abs(table["trainguard"]["command_ratio"] - (17.1 / 16.0 + 14.9 / 14.0) / 2) < 1e-9
