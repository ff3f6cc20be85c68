"""Light saved steps (losses, scalars only) hook only the modules that gave them something, and
save exactly what a fully hooked step saves: same names, same values, every step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import trainguard.pytorch as tg
from trainguard.hooks import torch_io_sources
from trainguard.hooks.zero_code import ZeroCodeHook
from trainguard.trials import create_trial

STEPS = 30


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


class _SelfLossModel(nn.Module):
    """Like a Hugging Face model: a new CrossEntropyLoss() inside every forward."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _mlp()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.CrossEntropyLoss()(self.body(x), y)


def _train(hook, model: nn.Module, loss_kind: str, *, swap_at: int | None = None) -> tuple[list[float], list[bool]]:
    """Train STEPS steps; return each step's loss and whether the step's forward ran narrow."""
    generator = torch.Generator().manual_seed(3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    criterion = nn.CrossEntropyLoss()
    old_criterion = criterion
    if loss_kind == "module" and not isinstance(hook, ZeroCodeHook):
        hook.register_module(model)
        hook.register_loss(criterion)
    losses, narrow = [], []
    for step in range(STEPS):
        if step == swap_at:
            criterion = nn.CrossEntropyLoss()  # the old one stays alive, not called again
            if not isinstance(hook, ZeroCodeHook):
                hook.register_loss(criterion)
        x, y = torch.randn(8, 6, generator=generator), torch.randint(0, 3, (8,), generator=generator)
        optimizer.zero_grad()
        if loss_kind == "inside":
            loss = model(x, y)
        else:
            logits = model(x)
            narrow.append(hook._module_io.narrow is not None)
            loss = criterion(logits, y) if loss_kind == "module" else F.cross_entropy(logits, y)
        if loss_kind == "inside":
            narrow.append(hook._module_io.narrow is not None)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert old_criterion is not None
    return losses, narrow


def _losses_by_step(out_dir) -> dict[int, dict[str, float]]:
    trial = create_trial(str(out_dir), collection_wait_timeout=0)
    found: dict[int, dict[str, float]] = {step: {} for step in trial.steps()}
    for name in trial.tensor_names(collection="losses"):
        tensor = trial.tensor(name)
        for step in tensor.steps():
            found[step][name] = float(np.asarray(tensor.value(step)).reshape(-1)[0])
    return found


@pytest.mark.parametrize("hook_class", [ZeroCodeHook, tg.Hook], ids=["zero_code", "api"])
@pytest.mark.parametrize("loss_kind", ["module", "functional", "inside"])
def test_light_steps_save_what_fully_hooked_steps_save(make_hook, tmp_path, monkeypatch, hook_class, loss_kind):
    if hook_class is tg.Hook and loss_kind != "module":
        pytest.skip("the API hook captures losses from registered loss modules")
    results = {}
    for variant in ("narrow", "full"):
        if variant == "full":
            monkeypatch.setattr(torch_io_sources, "RECHECK_EVERY", 0)  # every light step fully hooked
        out_dir = tmp_path / variant
        hook = make_hook(hook_class, out_dir=str(out_dir), save_config=tg.SaveConfig(save_interval=1),
                         include_collections=["losses"])  # fmt: skip
        model = _SelfLossModel() if loss_kind == "inside" else _mlp()
        losses, narrow = _train(hook, model, loss_kind)
        hook.close()
        assert hook.enabled
        results[variant] = (losses, narrow, _losses_by_step(out_dir))
    losses, narrow, saved = results["narrow"]
    full_losses, full_narrow, full_saved = results["full"]
    assert losses == full_losses and not any(full_narrow)
    assert saved == full_saved  # same names and values at every step
    assert sorted(saved) == list(range(STEPS))
    for step, values in saved.items():
        assert len(values) == 1 and list(values.values())[0] == pytest.approx(losses[step], rel=1e-6), (step, values)
    if loss_kind == "inside":
        assert not any(narrow)  # a new loss module every forward: never the same object twice
    else:
        # two fully hooked steps to learn, then narrow except one fully hooked in RECHECK_EVERY + 1
        assert sum(narrow) >= (STEPS - 2) * torch_io_sources.RECHECK_EVERY // (torch_io_sources.RECHECK_EVERY + 1) - 1
        assert not narrow[0] and not narrow[1] and narrow[2]


@pytest.mark.parametrize("hook_class", [ZeroCodeHook, tg.Hook], ids=["zero_code", "api"])
def test_a_new_loss_module_never_changes_the_loss_names(make_hook, tmp_path, hook_class):
    """A new loss module takes over while the old one stays alive: the narrow step hooks the old
    one; what it saves under another name is dropped, and the next steps are fully hooked."""
    hook = make_hook(hook_class, out_dir=str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=1),
                     include_collections=["losses"])  # fmt: skip
    losses, narrow = _train(hook, _mlp(), "module", swap_at=12)
    hook.close()
    assert hook.enabled and narrow[11]
    saved = _losses_by_step(tmp_path / "run")
    names = {name for values in saved.values() for name in values}
    assert names == {"CrossEntropyLoss_output_0"} if hook_class is ZeroCodeHook else len(names) == 1
    missing = [step for step in range(STEPS) if not saved.get(step)]
    assert len(missing) <= 1, missing  # at most the step of the swap lost its light value
    for step in range(STEPS):
        if step not in missing:
            assert list(saved[step].values())[0] == pytest.approx(losses[step], rel=1e-6)
    assert narrow[-1]  # learned the new module, narrow again


def test_heavy_steps_stay_fully_hooked(make_hook, tmp_path):
    """Steps that save outputs hook every module, whatever light steps learned."""
    hook = make_hook(ZeroCodeHook, out_dir=str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=1),
                     include_collections=["losses", "outputs"])  # fmt: skip
    hook.get_collection("outputs").save_config = tg.SaveConfig(save_interval=5)
    losses, narrow = _train(hook, _mlp(), "module")
    hook.close()
    assert hook.enabled
    assert not any(narrow[step] for step in range(0, STEPS, 5))
    assert any(narrow)
    trial = create_trial(str(tmp_path / "run"), collection_wait_timeout=0)
    outputs = [name for name in trial.tensor_names(collection="outputs") if not name.startswith("CrossEntropy")]
    assert len(outputs) == 6  # every module of the Sequential and the Sequential itself
    assert all(trial.tensor(name).steps() == list(range(0, STEPS, 5)) for name in outputs)
