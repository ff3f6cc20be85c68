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
