"""What the PyTorch hook files as the model's data: root inputs fed by the data loader, not the model's
own outputs fed back, another model's outputs, or tensors with autograd history
(hooks/torch_data_identity.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import trainguard.pytorch as tg  # noqa: E402
from trainguard.trial import create_trial  # noqa: E402

COLLECTIONS = ["model_inputs", "losses"]


def _members(path):
    trial = create_trial(str(path))
    known = trial.collections()
    return {
        name: sorted(known[name].tensor_names) if name in known else []
        for name in ("model_inputs", "derived_inputs")
    }, trial


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(20, 8)
        self.rnn = nn.LSTM(8, 8)
        self.head = nn.Linear(8, 20)

    def forward(self, tokens, hidden):
        output, hidden = self.rnn(self.embedding(tokens), hidden)
        return self.head(output), hidden


def _hook(path, interval=5):
    return tg.Hook(str(path), save_config=tg.SaveConfig(save_interval=interval), include_collections=COLLECTIONS)


def _train_recurrent(path, next_state):
    """12 steps of ``Recurrent`` saved every 5th, its state for each call ``next_state(last state)``."""
    torch.manual_seed(0)
    model = Recurrent()
    hook = _hook(path)
    hook.register_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hidden = (torch.zeros(1, 4, 8), torch.zeros(1, 4, 8))
    for _ in range(12):
        output, hidden = model(torch.randint(0, 20, (6, 4)), next_state(hidden))
        loss = nn.functional.cross_entropy(output.view(-1, 20), torch.randint(0, 20, (24,)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    hook.close()
    return _members(path)


def test_a_recurrent_state_fed_back_detached_is_not_data_and_the_tokens_are(tmp_path):
    # the classic example's repackage_hidden
    members, trial = _train_recurrent(tmp_path / "run", lambda hidden: tuple(h.detach() for h in hidden))
    # the tokens, at the root and at the embedding (integer inputs anywhere are data)
    assert members["model_inputs"] == ["Recurrent_input_0", "embedding_input_0"]
    assert members["derived_inputs"] == ["Recurrent_input_1", "Recurrent_input_2"]
    # step 5 was saved with the fed-back state no longer filed as data: only the tokens
    assert "Recurrent_input_1" not in trial.tensor_names(step=5)
    assert "Recurrent_input_0" in trial.tensor_names(step=5)


def test_a_model_fed_a_new_state_each_step_keeps_it_as_data(tmp_path):
    """The same model, its state a fresh tensor at every call (not its output): data."""
    members, _ = _train_recurrent(tmp_path / "run", lambda hidden: (torch.randn(1, 4, 8), torch.randn(1, 4, 8)))
    assert members["model_inputs"] == [*(f"Recurrent_input_{index}" for index in range(3)), "embedding_input_0"]
    assert members["derived_inputs"] == []


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh())

    def forward(self, z):
        return self.net(z)


class Critic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(16, 1)

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize("detached", [True, False])
def test_one_models_output_fed_to_another_is_not_data(tmp_path, detached):
    """A critic fed only the generator's samples (detached or with their graph): not data; the
    generator's noise is."""
    torch.manual_seed(0)
    generator, critic = Generator(), Critic()
    hook = _hook(tmp_path / "run", interval=3)
    hook.register_module(generator)
    hook.register_module(critic)
    optimizer = torch.optim.SGD([*generator.parameters(), *critic.parameters()], lr=0.01)
    for _ in range(7):
        samples = generator(torch.randn(8, 4))
        score = critic(samples.detach() if detached else samples)
        optimizer.zero_grad()
        score.mean().backward()
        optimizer.step()
    hook.close()
    members, _ = _members(tmp_path / "run")
    assert members["model_inputs"] == ["Generator_input_0"]
    assert members["derived_inputs"] == ["Critic_input_0"]


def test_a_leaf_input_that_requires_grad_is_data(tmp_path):
    """A physics-informed net differentiates with respect to its inputs: they require grad, have no
    autograd history, and are data."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1))
    hook = _hook(tmp_path / "run", interval=2)
    hook.register_module(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(4):
        points = torch.rand(32, 2, requires_grad=True)
        u = model(points)
        (du,) = torch.autograd.grad(u.sum(), points, create_graph=True)
        optimizer.zero_grad()
        (du.pow(2).mean() + u.pow(2).mean()).backward()
        optimizer.step()
    hook.close()
    members, _ = _members(tmp_path / "run")
    assert members == {"model_inputs": ["Sequential_input_0"], "derived_inputs": []}


def test_a_model_that_returns_its_input_does_not_make_the_next_batch_of_the_same_tensor_derived(tmp_path):
    """Batches sliced from one data set tensor share its storage; a model that returns its input
    (an autoencoder returning (x, reconstruction)) must not make the next slice look fed back."""
    torch.manual_seed(0)

    class ReturnsInput(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 4)

        def forward(self, x):
            return x, self.net(x)

    model = ReturnsInput()
    dataset = torch.randn(64, 4)
    hook = _hook(tmp_path / "run", interval=2)
    hook.register_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for index in range(6):
        x, reconstruction = model(dataset[index * 8 : (index + 1) * 8])
        optimizer.zero_grad()
        (reconstruction - x).pow(2).mean().backward()
        optimizer.step()
    hook.close()
    members, _ = _members(tmp_path / "run")
    assert members == {"model_inputs": ["ReturnsInput_input_0"], "derived_inputs": []}


def test_zero_code_a_layer_whose_forward_is_called_directly_feeds_no_data(tmp_path):
    """``layer.forward(x)`` called by the script: its ReLU is the first module call, a root fed a
    pre-activation (autograd history): not data."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        torch.manual_seed(0)

        class Layer(nn.Linear):
            def __init__(self):
                super().__init__(6, 6)
                self.relu = nn.ReLU()

            def forward(self, x):
                return self.relu(x @ self.weight.T + self.bias)

        layer = Layer()
        optimizer = torch.optim.SGD(layer.parameters(), lr=0.01)
        for _ in range(6):
            loss = layer.forward(torch.randn(8, 6)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """))
    config = tmp_path / "hook.json"
    config.write_text('{"LocalPath": "x", "CollectionConfigurations": [{"CollectionName": "model_inputs"}], '
                      '"HookParameters": {"save_interval": "2"}}')
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "trainguard.cli", "run", "--out", str(out), "--config", str(config),
                           "--", sys.executable, str(script)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    members, trial = _members(out)
    assert members["model_inputs"] == [] and members["derived_inputs"] == ["ReLU_input_0"]
    assert "ReLU_input_0" not in trial.tensor_names()


def test_a_failure_while_checking_a_root_call_never_reaches_training():
    """The check runs in the root's pre-forward, outside the hook's fail-open capture: a tensor
    whose storage cannot be read leaves the input undecided and training untouched."""
    from trainguard.config.collections import CollectionManager
    from trainguard.hooks.torch_data_identity import DataIdentity

    class NoStorage(torch.Tensor):
        def untyped_storage(self):
            raise TypeError("this tensor type has no storage")

    identity = DataIdentity(CollectionManager.pytorch_defaults(), lambda name, collection: None)
    identity.saved_root_call("Net", 0, [torch.randn(3)], [torch.randn(3)])
    assert identity.watching
    identity.next_root_call("Net", [torch.randn(3).as_subclass(NoStorage)])
    assert not identity.watching and identity.derived() == frozenset()
