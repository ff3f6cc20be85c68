"""The run says which framework wrote it, so rules give that framework's fix hints."""

from __future__ import annotations

import pytest

from tests.trial.test_trial_live import write_steps
from trainguard.modes import ModeKeys
from trainguard.rules import get_rule_class
from trainguard.storage import LocalStore
from trainguard.trial import create_trial


def test_a_pytorch_run_names_its_framework_and_gets_pytorch_hints(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    import trainguard.pytorch as tg
    from trainguard.config import SaveConfig

    model = torch.nn.Linear(3, 1)
    hook = tg.Hook(out_dir=str(tmp_path / "run"), save_config=SaveConfig(save_interval=1))
    hook.register_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(4, 3)).pow(2).mean().backward()
        optimizer.step()
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.framework == "pytorch"
    rule = get_rule_class("ExplodingTensor")(trial)
    assert rule.framework() == "pytorch" and rule.hint_for(rule.framework()) == rule.fix_hints["pytorch"]


def test_a_run_that_does_not_say_has_no_framework(tmp_path) -> None:
    write_steps(LocalStore(tmp_path), [(0, ModeKeys.TRAIN, 0)])  # no framework in _meta (as smdebug writes)
    assert create_trial(tmp_path).framework is None
