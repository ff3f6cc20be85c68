"""A PyTorch hook writing straight to a real S3 endpoint (moto server process) while a trial
follows the run live through the local disk cache."""

from __future__ import annotations

import numpy as np
import pytest

from tests.s3_server import s3_bucket, s3_endpoint  # noqa: F401  (fixtures)

torch = pytest.importorskip("torch")


def test_hook_to_s3_and_live_trial_with_cache(s3_endpoint: str, s3_bucket: str, tmp_path, monkeypatch) -> None:
    import trainguard.pytorch as tg
    from trainguard.storage.cache import CachingStore
    from trainguard.trials import create_trial

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    url = f"s3://{s3_bucket}/jobs/exp1"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = tg.Hook(url, save_config=tg.SaveConfig(save_interval=1), include_collections=["weights", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(criterion)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    weights_at_step = {}

    def train(steps: int) -> None:
        for _ in range(steps):
            weights_at_step[len(weights_at_step)] = model[0].weight.detach().clone()
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()

    train(3)
    hook._writer.flush()
    trial = create_trial(url, endpoint_url=s3_endpoint, cache=tmp_path / "cache", collection_wait_timeout=30)
    assert isinstance(trial.store, CachingStore)
    assert not trial.loaded_all_steps  # live: no end marker yet
    train(2)
    hook.close()
    trial.wait_for_steps([4], timeout=60)
    assert trial.steps() == [0, 1, 2, 3, 4]
    assert trial.loaded_all_steps
    for step, expected in weights_at_step.items():
        np.testing.assert_array_equal(trial.tensor("Sequential_0.weight").value(step), expected.numpy())
    # Values come from the disk cache on the second read: the objects can even be gone from S3.
    from tests.s3_server import s3_client

    client = s3_client(s3_endpoint)
    for item in client.list_objects_v2(Bucket=s3_bucket, Prefix="jobs/exp1/events/")["Contents"]:
        client.delete_object(Bucket=s3_bucket, Key=item["Key"])
    np.testing.assert_array_equal(trial.tensor("Sequential_0.weight").value(0), weights_at_step[0].numpy())
