"""``trainguard tensorboard`` on a long run says how far it got: steps converted / total, on
stderr, at most every PROGRESS_INTERVAL seconds (nothing for an export shorter than that)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import trainguard.pytorch as tg  # noqa: E402
import trainguard.tensorboard as tensorboard  # noqa: E402
from trainguard.cli import main  # noqa: E402
from trainguard.modes import ModeKeys  # noqa: E402
from trainguard.tensorboard import ExportProgress, export_run  # noqa: E402


def test_progress_reports_at_most_every_interval_and_at_the_end() -> None:
    now = [0.0]
    seen: list[tuple[int, int]] = []
    tracker = ExportProgress(10, lambda done, total: seen.append((done, total)), interval=1.0, clock=lambda: now[0])
    for _ in range(10):
        now[0] += 0.4  # a step every 0.4 s: a report every third step
        tracker.step_done()
    tracker.finish()
    assert seen == [(3, 10), (6, 10), (9, 10), (10, 10)]
    quiet: list[tuple[int, int]] = []
    short = ExportProgress(10, lambda done, total: quiet.append((done, total)), interval=1.0, clock=lambda: 0.0)
    for _ in range(10):
        short.step_done()
    short.finish()
    assert quiet == []  # an export shorter than the interval prints nothing


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("progress") / "run"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    hook = tg.Hook(out_dir=str(out), save_config=tg.SaveConfig(save_interval=1), export_tensorboard=False)
    hook.register_module(model)
    hook.register_loss(loss := torch.nn.MSELoss())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(12):
        if step == 8:
            hook.set_mode(ModeKeys.EVAL)
        x, y = torch.randn(16, 4), torch.randn(16, 1)
        value = loss(model(x), y)
        if step < 8:
            optimizer.zero_grad()
            value.backward()
            optimizer.step()
    hook.close()
    return out


def test_export_reports_every_step_of_every_mode(run_dir: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tensorboard, "PROGRESS_INTERVAL", 0.0)
    seen: list[tuple[int, int]] = []
    export_run(str(run_dir), str(tmp_path / "tb"), progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (12, 12)  # 8 TRAIN + 4 EVAL steps
    assert [done for done, _ in seen] == sorted({done for done, _ in seen})  # increasing, never repeated


def test_cli_prints_progress_on_stderr(run_dir: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(tensorboard, "PROGRESS_INTERVAL", 0.0)
    assert main(["tensorboard", str(run_dir), str(tmp_path / "tb")]) == 0
    captured = capsys.readouterr()
    assert "trainguard: tensorboard: 12/12 steps converted" in captured.err
    assert "steps converted" not in captured.out and "wrote" in captured.out
