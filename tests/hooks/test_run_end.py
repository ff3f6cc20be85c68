"""The end marker of a run of several workers comes after every worker's last file.

Two hooks of one process stand for two ranks here (their rank is given, not found); the real
2-process gloo jobs are in test_distributed.py.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import trainguard.pytorch as tg
from trainguard.errors import ConfigError
from trainguard.format.layout import END_OF_TRAINING, collections_key, index_key, worker_end_key
from trainguard.hooks.run_end import PEER_WAIT_ENV
from trainguard.trials import create_trial


class RankHook(tg.Hook):
    def __init__(self, rank: int, world: int, **kwargs) -> None:
        self._given = (rank, world)
        super().__init__(**kwargs)

    def _rank_and_world(self) -> tuple[int, int]:
        return self._given


def _rank(out: Path, rank: int, world: int = 2) -> tuple[RankHook, nn.Module]:
    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    hook = RankHook(rank, world, out_dir=str(out), include_workers="all", save_config=tg.SaveConfig(save_interval=1))
    hook.register_module(model)
    return hook, model


def _train(model: nn.Module, steps: int) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(5, 3)).pow(2).mean().backward()
        optimizer.step()


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_worker_0_closing_first_marks_the_end_only_after_worker_1s_last_step(tmp_path, monkeypatch):
    monkeypatch.setenv(PEER_WAIT_ENV, "120")  # far longer than any bound below: waiting would show
    out = tmp_path / "run"
    hook0, model0 = _rank(out, 0)
    hook1, model1 = _rank(out, 1)
    _train(model0, 2)
    _train(model1, 2)
    began = time.monotonic()
    hook0.close()  # during training (not at exit): returns at once, the marker waits on a thread
    assert time.monotonic() - began < 30
    assert (out / worker_end_key("worker_0")).exists()
    time.sleep(0.5)
    assert not (out / END_OF_TRAINING).exists(), "worker_1 is still training"
    _train(model1, 3)  # worker_1 goes on: steps 2..4 (its last step is written at its close)
    assert not (out / END_OF_TRAINING).exists()
    hook1.close()
    assert _wait(lambda: (out / END_OF_TRAINING).exists(), 30)
    assert (out / worker_end_key("worker_1")).exists()
    assert (out / index_key(4, "worker_1")).exists()
    trial = create_trial(str(out))
    assert trial.training_ended and trial.workers() == ["worker_0", "worker_1"]
    assert trial.steps(show_incomplete_steps=True) == list(range(5))
    weights = [name for name in trial.tensor_names() if name.endswith(".weight") and "gradient" not in name]
    assert weights and trial.tensor(weights[0]).workers(4) == ["worker_1"]


def test_a_worker_that_never_ends_holds_the_marker_for_the_wait_only(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(PEER_WAIT_ENV, "0.5")
    out = tmp_path / "run"
    hook0, model0 = _rank(out, 0, world=3)
    _train(model0, 2)
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        began = time.monotonic()
        hook0.close()
        assert _wait(lambda: (out / END_OF_TRAINING).exists(), 30)
        waited = time.monotonic() - began
    assert 0.4 <= waited < 30, waited
    assert "worker_1, worker_2 did not end" in caplog.text, caplog.text
    assert create_trial(str(out)).training_ended


def test_one_worker_runs_write_no_worker_markers(tmp_path):
    out = tmp_path / "run"
    hook, model = _rank(out, 0, world=1)
    _train(model, 2)
    hook.close()
    assert (out / END_OF_TRAINING).exists()
    assert not (out / "workers_ended").exists()


def test_include_workers_one_waits_for_the_ranks_that_write_their_losses(tmp_path, monkeypatch):
    """Under "one" the other ranks write their losses (light workers): rank 0 waits for those
    that wrote anything, and for nobody when none did (a script with a hook on rank 0 only)."""
    monkeypatch.setenv(PEER_WAIT_ENV, "120")  # far longer than any bound below
    out = tmp_path / "run"
    hooks, models, losses = [], [], []
    for rank in (0, 1):
        torch.manual_seed(rank)
        model, loss = nn.Linear(3, 1), nn.MSELoss()
        hook = RankHook(rank, 2, out_dir=str(out), include_workers="one", save_config=tg.SaveConfig(save_interval=1),
                        writer="process")  # fmt: skip
        hook.register_module(model)
        hook.register_loss(loss)
        hooks.append(hook), models.append(model), losses.append(loss)

    def train(rank: int, steps: int) -> None:
        optimizer = torch.optim.SGD(models[rank].parameters(), lr=0.1)
        for _ in range(steps):
            optimizer.zero_grad()
            losses[rank](models[rank](torch.randn(4, 3)), torch.zeros(4, 1)).backward()
            optimizer.step()

    train(0, 2)
    train(1, 1)
    # rank 1 is known to write from its first step on (not once its writer process got to it)
    assert (out / collections_key("worker_1")).exists()
    train(1, 1)
    hooks[0].close()
    time.sleep(0.5)
    assert not (out / END_OF_TRAINING).exists(), "worker_1 (losses only) is still training"
    train(1, 2)
    hooks[1].close()
    assert _wait(lambda: (out / END_OF_TRAINING).exists(), 30)
    assert (out / index_key(3, "worker_1")).exists()
    trial = create_trial(str(out))
    loss_name = trial.tensor_names(collection="losses")[0]
    assert trial.tensor(loss_name).workers(3) == ["worker_1"]

    alone = tmp_path / "alone"
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    hook = RankHook(0, 2, out_dir=str(alone), include_workers="one", save_config=tg.SaveConfig(save_interval=1))
    hook.register_module(model)
    _train(model, 2)
    began = time.monotonic()
    hook.close()
    assert _wait(lambda: (alone / END_OF_TRAINING).exists(), 30) and time.monotonic() - began < 30


@pytest.mark.parametrize("bad", ["-1", "soon", "inf", "nan"])
def test_a_bad_peer_wait_is_a_config_error(tmp_path, monkeypatch, bad):
    monkeypatch.setenv(PEER_WAIT_ENV, bad)
    with pytest.raises(ConfigError, match=PEER_WAIT_ENV):
        tg.Hook(out_dir=str(tmp_path / "run"))
