"""bench/real_stacks.py must keep working: one stack, its three variants, at 1 % of its steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
        assert row["cpu_ratio_mean"] > 0  # the training process's own CPU time was read
    assert all(run["loop_cpu_s"] > 0 for run in document["runs"])
    # kernel time and page faults of the loop, where the allocator's luck shows
    assert all(run["loop_sys_s"] >= 0 and run["loop_minflt"] >= 0 for run in document["runs"])


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
    assert table["trainguard"]["cpu_ratio_mean"] is None  # no CPU seconds in these rows


def test_the_training_processs_cpu_time_is_read_and_compared_with_the_plain_copies() -> None:
    sys.path.insert(0, str(REPO))
    from bench.real_stacks import _loop_cpu_seconds, summarise

    text = "BENCH_LOOP_SECONDS=2.0\nBENCH_LOOP_USAGE=user 1.5000 sys 0.2500 minflt 3 majflt 0 nvcsw 1 nivcsw 2\n"
    assert _loop_cpu_seconds(text) == 1.75
    assert _loop_cpu_seconds("BENCH_LOOP_SECONDS=2.0\n") is None
    rows = []
    for rep, cpu in enumerate([(1.0, 1.2, 1.21), (2.0, 2.0, 2.1)]):
        for variant, seconds in zip(("plain", "plain_2", "trainguard"), cpu, strict=True):
            rows.append({"condition": "quiet", "rep": rep, "stack": "mlp", "variant": variant, "loop_s": 3.0,
                         "command_s": 4.0, "loop_cpu_s": seconds, "peak_rss_mib": 300.0})  # fmt: skip
    table = {row["variant"]: row for row in summarise(rows)}
    assert abs(table["trainguard"]["cpu_ratio_mean"] - (1.21 / 1.1 + 2.1 / 2.0) / 2) < 1e-9


def test_layout_controls_are_plain_scripts_moved_in_memory_and_stay_out_of_the_baseline() -> None:
    sys.path.insert(0, str(REPO))
    from bench.real_stacks import command, layout_controls, summarise

    assert layout_controls(2) == ("layout_control_1", "layout_control_2")
    moved = command("mlp", "layout_control_1", 1.0, rep=0)
    assert moved == command("mlp", "layout_control_1", 1.0, rep=0)  # reproducible from run to run
    assert moved != command("mlp", "layout_control_1", 1.0, rep=1)  # another size each repetition
    assert moved != command("mlp", "layout_control_2", 1.0, rep=0)
    assert "trainguard" not in " ".join(moved) and moved[-2:] == command("mlp", "plain", 1.0)[-2:]
    rows = []
    for variant, seconds in (("plain", 9.6), ("plain_2", 10.0), ("layout_control_1", 11.0),
                             ("layout_control_2", 10.6), ("layout_control_3", 9.0), ("trainguard", 10.5)):  # fmt: skip
        rows.append({"condition": "quiet", "rep": 0, "stack": "mlp", "variant": variant, "loop_s": seconds,
                     "command_s": seconds + 5, "peak_rss_mib": 300.0})  # fmt: skip
    table = {row["variant"]: row for row in summarise(rows)}
    assert abs(table["trainguard"]["loop_ratio"] - 10.5 / 9.8) < 1e-9  # the baseline: the identical copies' mean
    # against the median of all five plain processes (9.0, 9.6, 10.0, 10.6, 11.0 -> 10.0)
    assert abs(table["trainguard"]["layout_ratio"] - 1.05) < 1e-9
    assert abs(table["layout_control_1"]["layout_ratio"] - 1.1) < 1e-9


def test_shifted_layouts_move_every_process_and_the_stack_imports_this_checkouts_trainguard() -> None:
    sys.path.insert(0, str(REPO))
    from bench.real_stacks import _environment, _half_width_95, command

    for variant in ("plain", "plain_2", "trainguard_si1000"):
        shifted = command("mlp", variant, 1.0, rep=3, shift_layouts=True)
        assert "bytearray(" in " ".join(shifted) and shifted != command("mlp", variant, 1.0, rep=3)
        assert shifted == command("mlp", variant, 1.0, rep=3, shift_layouts=True)  # same each run
    # X and X@base of one repetition share their shift: paired, they differ only in the code
    base = command("mlp", "trainguard@base", 1.0, baseline=Path("/base"), rep=3, shift_layouts=True)
    assert base[2:] == command("mlp", "trainguard", 1.0, rep=3, shift_layouts=True)
    # ...and the stack: an environment pad of each process's own, trainguard's inherited by its child
    pads = {variant: command("mlp", variant, 1.0, rep=3, shift_layouts=True)[:2] for variant in ("plain", "plain_2")}
    assert all(argv[0] == "env" and argv[1].startswith("BENCH_ENVIRONMENT_PAD=") for argv in pads.values())
    assert pads["plain"] != pads["plain_2"] and command("mlp", "plain", 1.0, rep=3)[0] != "env"
    # the script under a waiting parent: the same script, shifted as trainguard's would be
    tree = command("mlp", "parent_and_plain_child", 1.0, rep=3, shift_layouts=True)
    assert tree[3] == "-c" and "subprocess.call" in tree[4] and "trainguard" not in " ".join(tree)
    assert tree[5:] == command("mlp", "parent_and_plain_child", 1.0, rep=3, shift_layouts=True)[5:]
    assert _half_width_95([1.0, 1.0]) is None
    assert abs(_half_width_95([1.0, 2.0, 3.0]) - 4.303 / 3**0.5) < 1e-9  # t(2) * stdev 1 / sqrt(3)
    # the stack processes import trainguard from this checkout (a worktree times its own code)
    environment = _environment(0)
    found = subprocess.run([sys.executable, "-c", "import trainguard; print(trainguard.__file__)"],
                           env=environment, capture_output=True, text=True, check=True)  # fmt: skip
    assert Path(found.stdout.strip()).resolve().is_relative_to((REPO / "src").resolve())


def test_loop_faults_are_read_from_the_usage_line_and_fixed_malloc_reaches_glibc() -> None:
    sys.path.insert(0, str(REPO))
    from bench.real_stacks import FIXED_MALLOC, _loop_faults

    line = "BENCH_LOOP_USAGE=user 9.3000 sys 2.6500 minflt 1773634 majflt 0 nvcsw 37 nivcsw 26"
    assert _loop_faults(f"noise\n{line}\n") == {"loop_sys_s": 2.65, "loop_minflt": 1773634}
    assert _loop_faults("no usage line") == {}
    # glibc reads exactly these names (mallopt(3)): a typo would silently leave the heap trimming
    assert set(FIXED_MALLOC) == {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"}
    assert all(value.isdigit() for value in FIXED_MALLOC.values())


def test_a_later_run_with_first_rep_draws_new_seeds_and_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """--first-rep: more repetitions in a second invocation are new draws of the hash seed and
    the layouts, not the first invocation's repetitions again."""
    sys.path.insert(0, str(REPO))
    import bench.real_stacks as real_stacks

    calls: list[tuple[int | None, dict[str, list[str]]]] = []

    def record(argvs: dict[str, list[str]], slice_seconds: float, hash_seed: int | None = None) -> dict:
        calls.append((hash_seed, argvs))
        return {variant: {"loop_s": 1.0, "command_s": 2.0, "peak_rss_mib": 100.0} for variant in argvs}

    monkeypatch.setattr(real_stacks, "run_in_turns_once", record)
    variants = ("plain", "trainguard_si1000")
    first = real_stacks.measure(["mlp"], 2, 1.0, "quiet", variants=variants, shift_layouts=True)
    later = real_stacks.measure(["mlp"], 2, 1.0, "quiet", variants=variants, shift_layouts=True, first_rep=2)
    assert [row["rep"] for row in first] == [0, 0, 1, 1] and [row["rep"] for row in later] == [2, 2, 3, 3]
    assert [seed for seed, _ in calls] == [0, 1, 2, 3]
    shifts = [argvs["trainguard_si1000"] for _, argvs in calls]
    assert len({" ".join(argv) for argv in shifts}) == 4  # four layouts, none repeated
    assert calls[2][1] == {v: real_stacks.command("mlp", v, 1.0, rep=2, shift_layouts=True) for v in variants}
