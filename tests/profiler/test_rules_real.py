"""Profiler rules on real PyTorch training runs (CPU only, a few seconds each)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import trainguard.pytorch as tg
from tests.profiler._loops import small_model, train
from trainguard.profiler import Profiler, read_step_timings
from trainguard.rules import RuleSpec, create_rule
from trainguard.trial import create_trial


def finish(run: Path | object, spec: str):
    return create_rule(run if not isinstance(run, Path) else str(run), RuleSpec.parse(spec)).finish()


def test_slow_dataset_fires_dataloader_and_a_normal_loop_does_not(tmp_path: Path) -> None:
    slow, normal = tmp_path / "slow", tmp_path / "normal"
    with Profiler(slow, interval_ms=100):
        train(15, batch=8, item_delay_s=0.01, model_kind="tiny")  # 80 ms of sleep per batch in __getitem__
    with Profiler(normal, interval_ms=100):
        train(30)
    fired = finish(slow, "Dataloader")
    assert fired.fired and "waiting for data" in fired.message
    (stats,) = fired.details["stats"].values()
    assert stats["data_percent"] > 50 and stats["median_data_s"] >= 0.08
    quiet = finish(normal, "Dataloader")
    assert quiet is not None and not quiet.fired, quiet


def test_step_outlier_fires_on_injected_slow_steps(tmp_path: Path) -> None:
    # 14 of 300 steps get an extra 300 ms: few enough (under ~9 %) that they stay above
    # mean + 3 std, with about 100 ms to spare for the noise of a busy machine.
    slow_steps = frozenset(range(20, 300, 20))
    with Profiler(tmp_path, interval_ms=500, system=False):
        train(300, batch=4, slow_steps=slow_steps, slow_step_s=0.3, model_kind="tiny")
    steps = [s for s in read_step_timings(tmp_path) if s.mode == "TRAIN"]
    assert len(steps) == 300 and all(steps[i].duration >= 0.3 for i in slow_steps)
    result = finish(tmp_path, "StepOutlier")
    assert result.fired, result.details
    assert result.details["stats"][next(iter(result.details["stats"]))]["outliers"] >= len(slow_steps)


def test_max_initialization_time_on_a_late_first_step(tmp_path: Path) -> None:
    late, prompt = tmp_path / "late", tmp_path / "prompt"
    with Profiler(late, interval_ms=100):
        time.sleep(1.0)  # "loading data" before the first step
        train(3)
    with Profiler(prompt, interval_ms=100):
        train(3)
    threshold = "MaxInitializationTime:threshold=0.01"  # 0.6 s
    result = finish(late, threshold)
    assert result.fired and result.details["initialization_s"] >= 0.9
    assert not finish(prompt, threshold).fired


def test_cpu_only_run_gpu_rules_do_not_fire(tmp_path: Path) -> None:
    with Profiler(tmp_path, interval_ms=100):
        train(20)
        time.sleep(0.3)
    cpu = finish(tmp_path, "CPUBottleneck:patience=1")
    assert not cpu.fired and "no GPU metrics" in cpu.message
    for spec in (
        "LowGPUUtilization:patience=1,window=1",
        "GPUMemoryIncrease:patience=1,window=2",
        "LoadBalancing:patience=1",
    ):
        result = finish(tmp_path, spec)
        assert result is None or not result.fired
    usage = finish(tmp_path, "OverallSystemUsage")
    assert not usage.fired and any(key.endswith("/TotalCPUUtilization") for key in usage.details["statistics"])


def test_rules_find_profiler_output_through_the_tensor_trial(tmp_path: Path) -> None:
    """The runner passes the run's tensor trial: profiler data sits beside the tensors."""
    run = tmp_path / "run"
    model = small_model()
    hook = tg.Hook(out_dir=str(run), save_config=tg.SaveConfig(save_interval=5), include_collections=["losses"])
    hook.register_module(model)
    with Profiler(run, interval_ms=100, node_id="algo-1"):
        import torch

        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        loss_fn = torch.nn.CrossEntropyLoss()
        hook.register_loss(loss_fn)
        for step in range(40):
            x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
            if step % 10 == 0:
                time.sleep(0.02)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    hook.close()
    trial = create_trial(str(run))
    assert trial.steps()  # the tensor side is intact next to profiler-output/
    rule = create_rule(trial, RuleSpec.parse("Dataloader:scan_interval_us=1"))
    results = [rule.check(step) for step in trial.steps()]
    assert results[0] is not None and all(r is None for r in results[1:])  # later checks: nothing new
    stats = rule.finish().details["stats"]
    assert list(stats) == ["algo-1/0"] and stats["algo-1/0"]["steps"] == 39  # the first step is skipped
    # 40 steps: too few for StepOutlier, which says so instead of "no issues"
    assert create_rule(trial, RuleSpec.parse("StepOutlier")).finish().not_evaluated == "40 steps, needs more than 100"


@pytest.mark.parametrize("interval_ms", [100, 500])
def test_profiler_does_not_change_training(tmp_path: Path, interval_ms: int) -> None:
    import torch

    def losses() -> list[float]:
        model = small_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        generator = torch.Generator().manual_seed(1)
        out = []
        for _ in range(5):
            x, y = torch.randn(8, 1, 28, 28, generator=generator), torch.randint(0, 10, (8,), generator=generator)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            out.append(loss.item())
        return out

    plain = losses()
    with Profiler(tmp_path, interval_ms=interval_ms):
        profiled = losses()
    assert profiled == plain
    assert torch.Tensor.backward.__module__ == "torch._tensor"  # wrappers removed at stop()


def test_live_rule_on_s3_through_a_caching_trial(
    s3_endpoint: str, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live S3 run read through the trial's disk cache: the growing minute files are re-read
    from S3 (never served stale from the cache), so each scan sees the new samples."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)  # for the hook
    url = f"s3://{s3_bucket}/runs/live"
    hook = tg.Hook(out_dir=url, save_config=tg.SaveConfig(save_interval=1), include_collections=["losses"])
    model = small_model("tiny")
    hook.register_module(model)
    import torch

    loss_fn = torch.nn.CrossEntropyLoss()
    hook.register_loss(loss_fn)
    loss_fn(model(torch.randn(2, 1, 28, 28)), torch.tensor([0, 1])).backward()  # step 0: the trial exists
    with Profiler(url, interval_ms=100, framework=False, flush_interval_s=0.2, endpoint_url=s3_endpoint):
        trial = create_trial(url, endpoint_url=s3_endpoint, cache=str(tmp_path / "cache"))
        rule = create_rule(trial, RuleSpec.parse("OverallSystemUsage:scan_interval_us=1"))
        counts = []
        for _ in range(3):
            time.sleep(0.6)
            result = rule.check_idle(time.time())
            if result is not None:
                counts.append(result.details["statistics"][next(iter(result.details["statistics"]))]["samples"])
    hook.close()
    final = rule.finish().details["statistics"]
    assert len(counts) >= 2 and counts == sorted(counts) and counts[-1] > counts[0], counts
    assert next(iter(final.values()))["samples"] >= counts[-1]
