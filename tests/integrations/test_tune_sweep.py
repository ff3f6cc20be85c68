"""A real Ray Tune sweep (examples/sweeps/tune_sweep.py) on a local 2-CPU Ray instance: 4 small
PyTorch trainings captured by the hook, the default rules running live inside each trial. The
trials keep training after a finding (``stop_in_trainable=False``), so it is TrainguardStopper
that must end the two bad ones early, with the finding in their last result; the good ones run
all their steps with no finding."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
ray = pytest.importorskip("ray")
pytest.importorskip("ray.tune")

from tests.integrations._sweeps import EXPECTED_RULES, GOOD, load_example  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture
def local_ray():
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def test_tune_sweep_stops_the_bad_trials_early(tmp_path, local_ray):
    example = load_example("tune_sweep")
    results = example.run_sweep(str(tmp_path), stop_in_trainable=False)
    assert results.num_errors == 0, [str(r.error) for r in results if r.error]
    metrics = {result.config["config"]["name"]: result.metrics for result in results}
    assert set(metrics) == {config["name"] for config in example.toy_training.CONFIGS}
    full = max(m["steps"] for m in metrics.values())
    for name in GOOD:
        assert metrics[name]["trainguard_stop"] is False, metrics[name]
        assert metrics[name]["trainguard_issue"] == ""
        assert metrics[name]["steps"] == full
    for name, rules in EXPECTED_RULES.items():
        result = metrics[name]
        assert result["trainguard_stop"] is True, (name, result)
        assert result["trainguard_rule"] in rules, result["trainguard_issue"]
        assert result["trainguard_finding"]["certain"] is True
        assert result["trainguard_issue"].startswith(f"{result['trainguard_rule']} at step ")
        # the stopper took the first result carrying the finding: nothing was trained after it
        assert result["trainguard_step"] < result["steps"] < full / 2, (name, result)
        assert result["training_iteration"] == result["steps"] // example.toy_training.STEPS_PER_EPOCH
