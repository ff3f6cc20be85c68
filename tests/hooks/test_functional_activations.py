"""Activations called as functions or tensor methods are captured for the activation rules.

Real small training runs: the model records what it computed, the test compares what the hook
saved with it, and DeadRelu / SaturatedActivation read the result.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import trainguard.pytorch as tg
from tests.rules.synthetic import evaluate_rule
from trainguard.hooks.zero_code import ZeroCodeHook
from trainguard.rules import RuleSpec
from trainguard.trials import create_trial

ACTIVATIONS = ["relu_input", "relu_output", "tanh_input", "tanh_output", "sigmoid_input", "sigmoid_output"]


class Block(nn.Module):
    def __init__(self, seen: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.seen = seen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        self.seen["block_pre"] = h.detach().clone()
        a = F.relu(h)  # relu_0
        b = torch.tanh(h)  # tanh_0
        c = h.sigmoid()  # sigmoid_0
        d = F.gelu(h)  # relu_1 (ReLU family)
        e = h.relu()  # relu_2
        self.seen["block_gelu"] = d.detach().clone()
        return a + b + c + d + e


class FunctionalNet(nn.Module):
    """Functional activations in the root and in a child, one module activation, one in-place."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, torch.Tensor] = {}
        self.fc1 = nn.Linear(4, 6)
        self.block = Block(self.seen)
        self.act = nn.ReLU()  # a module: captured as act_input_0/act_output_0, not twice
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        self.seen["root_pre"] = h.detach().clone()
        h = F.leaky_relu(h.clone(), 0.1, inplace=True)  # relu_0 of the root, in place
        self.seen["modes_active"] = torch.tensor(torch._C._len_torch_function_stack())
        h = self.act(self.block(h))
        return self.fc2(torch.sigmoid(h))  # sigmoid_0 of the root


def _train(model: nn.Module, steps: int, records: list[dict[str, torch.Tensor]] | None = None) -> list[float]:
    torch.manual_seed(3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if records is not None:
            records.append(dict(getattr(model, "seen", {})))
    return losses


def test_functional_and_method_activations_are_saved_with_their_values(make_hook, run_dir):
    torch.manual_seed(0)
    plain, hooked = FunctionalNet(), FunctionalNet()
    hooked.load_state_dict(plain.state_dict())
    reference = _train(plain, 4)
    hook = make_hook(save_config=tg.SaveConfig(save_interval=2), include_collections=ACTIVATIONS)
    hook.register_module(hooked)
    records: list[dict[str, torch.Tensor]] = []
    assert _train(hooked, 4, records) == reference  # training unchanged
    hook.close()
    trial = create_trial(run_dir)
    assert trial.steps() == [0, 2]
    expected_names = {
        "FunctionalNet.relu_0_input", "FunctionalNet.relu_0_output",
        "FunctionalNet.sigmoid_0_input", "FunctionalNet.sigmoid_0_output",
        "block.relu_0_input", "block.relu_0_output", "block.relu_1_input", "block.relu_1_output",
        "block.relu_2_input", "block.relu_2_output", "block.tanh_0_input", "block.tanh_0_output",
        "block.sigmoid_0_input", "block.sigmoid_0_output", "act_input_0", "act_output_0",
    }  # fmt: skip
    assert set(trial.tensor_names()) >= expected_names
    assert not [name for name in trial.tensor_names() if name.startswith("act.")], "nn.ReLU captured twice"
    assert set(trial.tensor_names(collection="relu_output")) == {
        "FunctionalNet.relu_0_output", "block.relu_0_output", "block.relu_1_output", "block.relu_2_output",
        "act_output_0",
    }  # fmt: skip
    assert set(trial.tensor_names(collection="tanh_input")) == {"block.tanh_0_input"}
    assert set(trial.tensor_names(collection="sigmoid_input")) == {"FunctionalNet.sigmoid_0_input",
                                                                  "block.sigmoid_0_input"}  # fmt: skip
    for step in (0, 2):
        seen = records[step]
        root_pre, block_pre = seen["root_pre"].numpy(), seen["block_pre"].numpy()
        # the in-place call's input is saved before the call overwrote it
        np.testing.assert_array_equal(trial.tensor("FunctionalNet.relu_0_input").value(step), root_pre)
        np.testing.assert_array_equal(trial.tensor("FunctionalNet.relu_0_output").value(step),
                                      F.leaky_relu(seen["root_pre"], 0.1).numpy())  # fmt: skip
        np.testing.assert_array_equal(trial.tensor("block.tanh_0_input").value(step), block_pre)
        np.testing.assert_array_equal(trial.tensor("block.tanh_0_output").value(step),
                                      torch.tanh(seen["block_pre"]).numpy())  # fmt: skip
        np.testing.assert_array_equal(trial.tensor("block.relu_1_output").value(step), seen["block_gelu"].numpy())
        np.testing.assert_array_equal(trial.tensor("block.relu_2_output").value(step), np.maximum(block_pre, 0))
    # the torch-function mode exists only on saved steps
    assert [int(r["modes_active"]) for r in records] == [1, 0, 1, 0]


def test_nothing_is_intercepted_when_no_activation_collection_is_saved(make_hook, run_dir):
    torch.manual_seed(0)
    model = FunctionalNet()
    hook = make_hook(save_config=tg.SaveConfig(save_interval=1), include_collections=["weights", "losses"])
    hook.register_module(model)
    records: list[dict[str, torch.Tensor]] = []
    _train(model, 2, records)
    hook.close()
    assert [int(r["modes_active"]) for r in records] == [0, 0]
    assert not [name for name in create_trial(run_dir).tensor_names() if "relu" in name]


def test_zero_code_hook_names_functional_activations_the_same_way(run_dir):
    torch.manual_seed(0)
    model = FunctionalNet()
    hook = ZeroCodeHook(out_dir=str(run_dir), save_config=tg.SaveConfig(save_interval=2),
                        include_collections=ACTIVATIONS)  # fmt: skip
    try:
        records: list[dict[str, torch.Tensor]] = []
        _train(model, 3, records)
    finally:
        hook.close()
    trial = create_trial(run_dir)
    assert "block.tanh_0_input" in trial.tensor_names(collection="tanh_input")
    assert "FunctionalNet.relu_0_output" in trial.tensor_names(collection="relu_output")
    np.testing.assert_array_equal(trial.tensor("block.tanh_0_input").value(2), records[2]["block_pre"].numpy())
    assert [int(r["modes_active"]) for r in records] == [1, 0, 1]


class MLP(nn.Module):
    """Two hidden layers with functional ReLUs; ``dead`` pushes the second one's pre-activation
    far below zero, the classic dead-ReLU bug (a huge negative bias)."""

    def __init__(self, dead: bool) -> None:
        super().__init__()
        self.fc1, self.fc2, self.out = nn.Linear(10, 32), nn.Linear(32, 32), nn.Linear(32, 2)
        if dead:
            with torch.no_grad():
                self.fc2.bias.fill_(-50.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.fc2(torch.relu(self.fc1(x)))))


def _dead_relu_results(run_dir, dead: bool):
    torch.manual_seed(0)
    model = MLP(dead)
    hook = tg.Hook(out_dir=str(run_dir), save_config=tg.SaveConfig(save_interval=2),
                   include_collections=["relu_output", "losses"])  # fmt: skip
    hook.register_module(model)
    try:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        generator = torch.Generator().manual_seed(1)
        for _ in range(40):
            x = torch.randn(32, 10, generator=generator)
            y = (x[:, 0] > 0).long()
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        hook.close()
    return evaluate_rule(run_dir, RuleSpec("DeadRelu"))


def test_dead_relu_fires_on_a_dead_functional_relu_and_not_on_a_healthy_one(tmp_path):
    dead = _dead_relu_results(tmp_path / "dead", dead=True)
    healthy = _dead_relu_results(tmp_path / "healthy", dead=False)
    fired = [result for result in dead if result.fired]
    assert fired, [r.message for r in dead]
    assert any("MLP.relu_1_output" in result.message for result in fired), fired[0].message
    assert not any(getattr(result, "not_evaluated", None) for result in healthy), [r.message for r in healthy]
    assert not any(result.fired for result in healthy), [r.message for r in healthy if r.fired]


def test_compiled_model_saves_the_functional_activations_of_an_eager_run(make_hook, tmp_path):
    """Under torch.compile a saved step runs the model eagerly (torch_compiled.py), so the mode is
    entered outside any graph: the same names and values as an eager run, training unchanged."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    plain, eager_hooked, hooked = FunctionalNet(), FunctionalNet(), FunctionalNet()
    eager_hooked.load_state_dict(plain.state_dict())
    hooked.load_state_dict(plain.state_dict())
    reference = _train(plain, 4)
    runs = {}
    for kind, model in (("eager", eager_hooked), ("compiled", hooked)):
        hook = make_hook(out_dir=str(tmp_path / kind), save_config=tg.SaveConfig(save_interval=2),
                         include_collections=ACTIVATIONS)  # fmt: skip
        hook.register_module(model)
        assert _train(torch.compile(model, backend="eager") if kind == "compiled" else model, 4) == reference
        hook.close()
        assert hook.enabled
        runs[kind] = create_trial(str(tmp_path / kind))
    names = runs["eager"].tensor_names()
    assert "block.relu_1_output" in names and "act_output_0" in names
    assert runs["compiled"].tensor_names() == names
    assert runs["compiled"].steps() == runs["eager"].steps() == [0, 2]
    for name in names:
        for step in (0, 2):
            compiled_value = runs["compiled"].tensor(name).value(step)
            np.testing.assert_array_equal(compiled_value, runs["eager"].tensor(name).value(step))
