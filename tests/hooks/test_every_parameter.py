"""Every trainable parameter that is not a bias is in ``weights``, whatever its name (issue 43
item 4): bare ``nn.Parameter``s on a submodule or on the root, ``ParameterList`` and
``ParameterDict`` entries, next to the smdebug names ``nn.Linear`` keeps."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import trainguard.pytorch as tg
from trainguard.trials import create_trial


class GraphConvolution(nn.Module):
    def __init__(self, fan_in: int, fan_out: int) -> None:
        super().__init__()
        self.kernel = nn.Parameter(torch.randn(fan_in, fan_out) * 0.3)
        self.offset = nn.Parameter(torch.zeros(fan_out))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.kernel + self.offset


class Odd(nn.Module):
    """Parameters named every way a script may name them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = GraphConvolution(4, 6)
        self.scale = nn.Parameter(torch.ones(6))  # bare, on the root
        self.filters = nn.ParameterList([nn.Parameter(torch.randn(6, 6) * 0.3) for _ in range(2)])
        self.table = nn.ParameterDict({"mix": nn.Parameter(torch.randn(6, 3) * 0.3)})
        self.head = nn.Linear(3, 3)
        self.frozen = nn.Parameter(torch.randn(3, 3), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x)) * self.scale
        for kernel in self.filters:
            h = torch.tanh(h @ kernel)
        return self.head(h @ self.table["mix"]) @ self.frozen


WEIGHTS = {"Odd_conv.kernel", "Odd_conv.offset", "Odd_scale", "Odd_filters.0", "Odd_filters.1", "Odd_table.mix",
           "Odd_head.weight"}  # fmt: skip


def _train(run_dir, steps: int = 4, **hook_kwargs) -> tuple[Odd, list[dict[str, np.ndarray]]]:
    torch.manual_seed(0)
    model = Odd()
    hook = tg.Hook(str(run_dir), save_config=tg.SaveConfig(save_interval=1), **hook_kwargs)
    hook.register_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    try:
        for _ in range(steps):
            seen.append({name: p.detach().clone().numpy() for name, p in model.named_parameters()})
            optimizer.zero_grad()
            model(torch.randn(8, 4)).square().mean().backward()
            optimizer.step()
    finally:
        hook.close()
    return model, seen


def test_parameters_of_any_name_are_weights_and_their_gradients_saved(tmp_path):
    _, seen = _train(tmp_path / "run")
    trial = create_trial(str(tmp_path / "run"))
    assert set(trial.tensor_names(collection="weights")) == WEIGHTS
    assert set(trial.tensor_names(collection="biases")) == {"Odd_head.bias"}
    assert set(trial.tensor_names(collection="gradients")) == {f"gradient/{name}" for name in WEIGHTS | {"Odd_head.bias"}}
    # the values are the parameters as each step began (numpy oracle: the copies taken above)
    for step, values in enumerate(seen):
        for name in WEIGHTS:
            np.testing.assert_array_equal(trial.tensor(name).value(step), values[name.removeprefix("Odd_")])


def test_a_bias_stays_a_bias_and_a_user_s_weights_collection_keeps_its_regex(tmp_path):
    _train(tmp_path / "run", include_collections=["weights", "losses"])
    trial = create_trial(str(tmp_path / "run"))
    # biases are not included: the name-based bias is not made a weight
    assert set(trial.tensor_names()) == WEIGHTS
    assert trial.collection("weights").include_regex == [r"^(?!gradient).*weight"]


def test_frozen_parameters_are_not_weights_of_the_model(tmp_path):
    model, _ = _train(tmp_path / "run", steps=2)
    trial = create_trial(str(tmp_path / "run"))
    assert not model.frozen.requires_grad and "Odd_frozen" not in trial.tensor_names()


def test_a_weights_collection_defined_anew_holds_only_what_it_names(tmp_path):
    defaults = [c for c in tg.CollectionManager.pytorch_defaults() if c.name != "weights"]
    manager = tg.CollectionManager([tg.Collection("weights", include_regex=[r"^Odd_head\.weight$"]), *defaults])
    _train(tmp_path / "run", steps=2, collection_manager=manager, include_collections=["weights"])
    assert set(create_trial(str(tmp_path / "run")).tensor_names()) == {"Odd_head.weight"}
