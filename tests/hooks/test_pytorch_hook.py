"""The explicit PyTorch hook API (``import trainguard.pytorch as tg``) against real training and
the real reader: names, values, schedules, modes, reductions, JSON config, dtypes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn as nn

import trainguard.pytorch as tg
from tests.hooks._util import PARAMS, as_numpy, batches, seeded_model
from trainguard.errors import TensorUnavailableForStep
from trainguard.format.layout import END_OF_TRAINING
from trainguard.hooks.pytorch import TorchHook
from trainguard.trials import create_trial

TRAIN, EVAL = tg.modes.TRAIN, tg.modes.EVAL


def _setup(make_hook, *, lr=0.1, momentum=0.0, dtype=torch.float32, **hook_kwargs):
    model = seeded_model(dtype=dtype)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    hook_kwargs.setdefault("save_config", tg.SaveConfig(save_interval=1))
    hook = make_hook(**hook_kwargs)
    hook.register_module(model)
    hook.register_loss(criterion)
    return model, criterion, optimizer, hook


def _train_steps(model, criterion, optimizer, count, *, seed=1):
    for x, y in batches(count, seed=seed):
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()


def _eval_steps(model, criterion, count, *, seed=2):
    model.eval()
    with torch.no_grad():
        for x, y in batches(count, seed=seed):
            criterion(model(x), y)
    model.train()


# -- names ------------------------------------------------------------------------------------
def test_tensor_names_are_smdebugs(make_hook, run_dir):
    model, criterion, optimizer, hook = _setup(
        make_hook, include_collections=["weights", "biases", "gradients", "losses", "outputs", "inputs"]
    )
    data = batches(2)
    _train_steps(model, criterion, optimizer, 2)
    hook.close()

    trial = create_trial(run_dir)
    params = {f"Net_{name}" for name in PARAMS}
    outputs = {"Net_output_0", "fc1_output_0", "relu_output_0", "fc2_output_0", "CrossEntropyLoss_output_0"}
    inputs = {
        "Net_input_0",
        "fc1_input_0",
        "relu_input_0",
        "fc2_input_0",
        "CrossEntropyLoss_input_0",
        "CrossEntropyLoss_input_1",
    }
    assert set(trial.tensor_names()) == params | {f"gradient/{name}" for name in params} | outputs | inputs
    assert trial.tensor_names(collection="weights") == ["Net_fc1.weight", "Net_fc2.weight"]
    assert trial.tensor_names(collection="biases") == ["Net_fc1.bias", "Net_fc2.bias"]
    assert trial.tensor_names(collection="gradients") == sorted(f"gradient/{name}" for name in params)
    assert trial.tensor_names(collection="losses") == ["CrossEntropyLoss_output_0"]
    assert trial.steps() == [0, 1]
    assert trial.workers() == ["worker_0"]
    assert trial.training_ended
    # criterion(output, target): input_0 is the model output, input_1 the target (smdebug's order)
    x, y = data[0]
    np.testing.assert_array_equal(trial.tensor("CrossEntropyLoss_input_1").value(0), as_numpy(y))
    np.testing.assert_array_equal(trial.tensor("Net_input_0").value(0), as_numpy(x))
    np.testing.assert_array_equal(
        trial.tensor("CrossEntropyLoss_input_0").value(0), trial.tensor("Net_output_0").value(0)
    )


def test_default_collections_and_second_root_of_same_class(make_hook, run_dir):
    """Without include_collections: weights, biases, gradients, losses (no module outputs);
    a second registered root of the same class gets a unique prefix."""
    hook = make_hook(save_config=tg.SaveConfig(save_interval=1))
    first, second = seeded_model(0), seeded_model(1)
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD([*first.parameters(), *second.parameters()], lr=0.1)
    hook.register_module(first)
    hook.register_module(second)
    hook.register_loss(criterion)
    x = torch.randn(5, 4)
    optimizer.zero_grad()
    criterion(first(x), second(x)).backward()
    optimizer.step()
    hook.close()

    names = set(create_trial(run_dir).tensor_names())
    assert "MSELoss_output_0" in names
    assert not any(name.endswith("_output_0") and "Loss" not in name for name in names)
    assert {"Net_fc1.weight", "Net_1_fc1.weight", "gradient/Net_fc1.weight", "gradient/Net_1_fc1.weight"} <= names


# -- values -----------------------------------------------------------------------------------
def test_values_are_weights_at_step_start_and_gradients_the_optimizer_used(make_hook, run_dir):
    model, criterion, optimizer, hook = _setup(
        make_hook, momentum=0.9, include_collections=["weights", "biases", "gradients", "losses", "outputs"]
    )
    fc1_outputs = []
    model.fc1.register_forward_hook(lambda module, args, output: fc1_outputs.append(output.detach().clone()))
    expected = []
    for x, y in batches(4):
        weights = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        grads = {name: parameter.grad.detach().clone() for name, parameter in model.named_parameters()}
        optimizer.step()
        expected.append((weights, grads, loss.item()))
    hook.close()

    trial = create_trial(run_dir)
    assert trial.steps(TRAIN) == [0, 1, 2, 3]
    for step, (weights, grads, loss) in enumerate(expected):
        for name in PARAMS:
            saved = trial.tensor(f"Net_{name}").value(step)
            assert saved.dtype == np.float32
            np.testing.assert_array_equal(saved, as_numpy(weights[name]))
            np.testing.assert_array_equal(trial.tensor(f"gradient/Net_{name}").value(step), as_numpy(grads[name]))
        assert float(trial.tensor("CrossEntropyLoss_output_0").value(step)) == loss
        np.testing.assert_array_equal(trial.tensor("fc1_output_0").value(step), as_numpy(fc1_outputs[step]))
    # the weights really changed between steps (momentum SGD), so the comparison above is not vacuous
    assert not np.array_equal(trial.tensor("Net_fc1.weight").value(0), trial.tensor("Net_fc1.weight").value(3))


# -- schedules --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("save_config", "expected"),
    [
        (tg.SaveConfig(save_interval=3), [0, 3, 6, 9]),
        (tg.SaveConfig(), [0]),  # default interval 500
        # deviation (config/save_config.py): save_steps alone means exactly those steps
        (tg.SaveConfig(save_steps=[1, 4, 7]), [1, 4, 7]),
        (tg.SaveConfig(save_steps="2,5"), [2, 5]),
        # both: the union
        (tg.SaveConfig(save_interval=4, save_steps=[1]), [0, 1, 4, 8]),
        # deviation: the interval counts from start_step (smdebug: 3, 6, 9)
        (tg.SaveConfig(save_interval=3, start_step=2), [2, 5, 8]),
        # end_step is exclusive
        (tg.SaveConfig(save_interval=2, start_step=1, end_step=7), [1, 3, 5]),
    ],
)
def test_save_config_schedule(make_hook, run_dir, save_config, expected):
    model, criterion, optimizer, hook = _setup(make_hook, save_config=save_config)
    _train_steps(model, criterion, optimizer, 10)
    hook.close()
    trial = create_trial(run_dir)
    assert trial.steps(TRAIN) == expected
    for name in ("Net_fc1.weight", "gradient/Net_fc1.weight", "CrossEntropyLoss_output_0"):
        assert trial.tensor(name).steps(TRAIN) == expected


def test_per_mode_save_config(make_hook, run_dir):
    save_config = tg.SaveConfig(
        mode_save_configs={
            TRAIN: tg.SaveConfigMode(save_interval=2),
            "eval": tg.SaveConfigMode(save_steps=(1, 2)),
        }
    )
    model, criterion, optimizer, hook = _setup(make_hook, save_config=save_config)
    _train_steps(model, criterion, optimizer, 6)
    _eval_steps(model, criterion, 4)
    _train_steps(model, criterion, optimizer, 2, seed=3)
    hook.close()

    trial = create_trial(run_dir)
    assert trial.steps(TRAIN) == [0, 2, 4, 6]
    assert trial.steps(EVAL) == [1, 2]
    # global steps count every step, saved or not: 6 train, 4 eval, 2 train
    assert trial.global_step(EVAL, 1) == 7
    assert trial.global_step(TRAIN, 6) == 10
    assert trial.tensor("gradient/Net_fc1.weight").steps(EVAL) == []
    assert trial.tensor("CrossEntropyLoss_output_0").steps(EVAL) == [1, 2]


def test_collection_save_config_overrides_hook_schedule(make_hook, run_dir):
    model, criterion, optimizer, hook = _setup(make_hook, save_config=tg.SaveConfig(save_interval=1))
    hook.get_collection("gradients").save_config = tg.SaveConfig(
        mode_save_configs={TRAIN: tg.SaveConfigMode(save_interval=3)}
    )
    _train_steps(model, criterion, optimizer, 7)
    hook.close()
    trial = create_trial(run_dir)
    assert trial.tensor("Net_fc1.weight").steps() == list(range(7))
    assert trial.tensor("gradient/Net_fc1.weight").steps() == [0, 3, 6]



def test_collection_end_step_zero_switches_it_off(make_hook, run_dir):
    model, criterion, optimizer, hook = _setup(make_hook, save_config=tg.SaveConfig(save_interval=1))
    hook.get_collection("biases").save_config = tg.SaveConfig(end_step=0)  # smdebug's documented way
    _train_steps(model, criterion, optimizer, 3)
    hook.close()
    trial = create_trial(run_dir)
    assert trial.tensor("Net_fc1.weight").steps() == [0, 1, 2]
    assert not trial.has_tensor("Net_fc1.bias")


def test_collection_save_config_with_plain_interval_applies_to_every_mode(make_hook, run_dir):
    """smdebug: ``SaveConfig(save_interval=3)`` on a collection sets every mode (the hook's config
    only fills modes the collection's config does not have, and a plain interval has them all)."""
    model, criterion, optimizer, hook = _setup(make_hook, save_config=tg.SaveConfig(save_interval=1))
    hook.get_collection("gradients").save_config = tg.SaveConfig(save_interval=3)
    _train_steps(model, criterion, optimizer, 7)
    hook.close()
    assert create_trial(run_dir).tensor("gradient/Net_fc1.weight").steps() == [0, 3, 6]


# -- gradient accumulation --------------------------------------------------------------------
def _accumulating_run(make_hook, run_dir, optimizer_steps, micro_batches=2):
    model, criterion, optimizer, hook = _setup(make_hook)
    expected = []
    data = iter(batches(optimizer_steps * micro_batches))
    for _ in range(optimizer_steps):
        optimizer.zero_grad()
        weights = model.fc1.weight.detach().clone()
        losses = []
        for _ in range(micro_batches):
            x, y = next(data)
            loss = criterion(model(x), y) / micro_batches
            loss.backward()
            losses.append(loss.item())
        expected.append((weights, model.fc1.weight.grad.detach().clone(), losses))
        optimizer.step()
    hook.close()
    return create_trial(run_dir), expected


def test_gradient_accumulation_is_one_step_per_optimizer_step(make_hook, run_dir):
    trial, expected = _accumulating_run(make_hook, run_dir, optimizer_steps=4)
    # Every optimizer step is exactly one step, the first window too (an optimizer holding the
    # model's parameters exists by the first forward), holding the accumulated gradient the
    # optimizer used and the weights both micro-batches saw.
    train_steps = trial.steps(TRAIN)
    assert train_steps == [0, 1, 2, 3]
    for step, (weights, grad, _) in zip(train_steps, expected, strict=True):
        np.testing.assert_array_equal(trial.tensor("Net_fc1.weight").value(step, TRAIN), as_numpy(weights))
        np.testing.assert_array_equal(trial.tensor("gradient/Net_fc1.weight").value(step, TRAIN), as_numpy(grad))


def test_optimizer_that_never_steps_falls_back_to_one_step_per_forward(make_hook, run_dir):
    """An optimizer exists but the loop updates the weights by hand: the presumption is dropped.

    The weights changed in place between two forwards of the presumed first step, with no
    optimizer step: that ends the step at once (closure_steps.py, the check LBFGS's evaluations
    need), so every forward is a step from the first, not only after the presumption's limit.
    The first step reads its gradients as an optimizer steps or as it ends; this loop has zeroed
    them by then, so that step has none (the price of not hooking every parameter's gradient
    node at step 0, which would cost every usual loop a call into Python per parameter at every
    later backward: torch_optimizer.py). Every step after it has its gradient."""
    model, criterion, optimizer, hook = _setup(make_hook)
    limit = TorchHook.MAX_PRESUMED_FORWARDS
    forwards = limit + 6
    for x, y in batches(forwards):
        model.zero_grad()
        criterion(model(x), y).backward()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter -= 0.01 * parameter.grad
    hook.close()
    trial = create_trial(run_dir)
    # without the update check, the presumed first step spanned limit + 1 forwards
    steps = trial.steps(TRAIN)
    assert steps == list(range(forwards))
    assert trial.tensor("gradient/Net_fc1.weight").steps() == steps[1:]


def test_loop_without_an_optimizer_is_one_step_per_forward(make_hook, run_dir):
    model, criterion = seeded_model(), nn.CrossEntropyLoss()
    hook = make_hook(save_config=tg.SaveConfig(save_interval=1))
    hook.register_module(model)
    hook.register_loss(criterion)
    for x, y in batches(3):
        model.zero_grad()
        criterion(model(x), y).backward()
    hook.close()
    assert create_trial(run_dir).steps(TRAIN) == [0, 1, 2]


def test_gradient_accumulation_first_window_is_one_step(make_hook, run_dir):
    trial, _ = _accumulating_run(make_hook, run_dir, optimizer_steps=3)
    assert trial.steps(TRAIN) == [0, 1, 2]


# -- modes ------------------------------------------------------------------------------------
def test_modes_from_set_mode(make_hook, run_dir):
    model, criterion, optimizer, hook = _setup(make_hook)
    hook.set_mode(TRAIN)
    _train_steps(model, criterion, optimizer, 3)
    hook.set_mode(tg.modes.EVAL)
    for x, y in batches(2, seed=5):  # no model.eval(), grads enabled: the explicit mode wins
        criterion(model(x), y)
    hook.set_mode("train")
    _train_steps(model, criterion, optimizer, 2, seed=6)
    hook.close()
    _check_modes(create_trial(run_dir))


def test_modes_detected_from_eval_and_no_grad(make_hook, run_dir):
    model, criterion, optimizer, hook = _setup(make_hook)
    _train_steps(model, criterion, optimizer, 3)
    _eval_steps(model, criterion, 2, seed=5)
    _train_steps(model, criterion, optimizer, 2, seed=6)
    hook.close()
    _check_modes(create_trial(run_dir))


def _check_modes(trial):
    assert trial.modes() == [TRAIN, EVAL]
    assert trial.steps() == list(range(7))
    assert trial.steps(TRAIN) == [0, 1, 2, 3, 4]
    assert trial.steps(EVAL) == [0, 1]
    assert [trial.mode(step) for step in range(7)] == [TRAIN] * 3 + [EVAL] * 2 + [TRAIN] * 2
    assert [trial.mode_step(step) for step in range(7)] == [0, 1, 2, 0, 1, 3, 4]
    gradient = trial.tensor("gradient/Net_fc1.weight")
    assert gradient.steps(EVAL) == []
    assert gradient.steps(TRAIN) == [0, 1, 2, 3, 4]
    assert trial.tensor("Net_fc1.weight").steps(EVAL) == [0, 1]
    assert trial.tensor("CrossEntropyLoss_output_0").steps(EVAL) == [0, 1]
    assert trial.tensor_names(step=0, mode=EVAL) == [
        "CrossEntropyLoss_output_0", "Net_fc1.bias", "Net_fc1.weight", "Net_fc2.bias", "Net_fc2.weight",
    ]  # fmt: skip


# -- reductions -------------------------------------------------------------------------------
def saved_reduction(trial, name, step, reduction, absolute=False):
    """A saved reduction, read under smdebug's name ``smdebug/reductions/[abs_]<red>/<name>``."""
    return trial.tensor(f"smdebug/reductions/{'abs_' if absolute else ''}{reduction}/{name}").value(step)


ORACLES = {
    "min": np.min, "max": np.max, "mean": np.mean, "std": lambda x: np.std(x, ddof=0),
    "variance": lambda x: np.var(x, ddof=0), "sum": np.sum, "prod": np.prod,
    "zero_fraction": lambda x: np.mean(x == 0),
    "l1": lambda x: np.linalg.norm(x.ravel(), 1), "l2": lambda x: np.linalg.norm(x.ravel(), 2),
}  # fmt: skip


def test_reductions_without_raw_tensors_equal_numpy_oracles(make_hook, run_dir):
    reductions = ("min", "max", "mean", "std", "variance", "sum", "prod", "zero_fraction")
    config = tg.ReductionConfig(
        reductions=reductions, abs_reductions=("min", "max", "mean", "sum"), norms=("l1", "l2"),
        abs_norms=("l1", "l2"), save_raw_tensor=False,
    )  # fmt: skip
    model, criterion, optimizer, hook = _setup(
        make_hook, reduction_config=config, include_collections=["weights", "biases", "gradients", "losses", "outputs"]
    )
    relu_outputs = []
    model.relu.register_forward_hook(lambda module, args, output: relu_outputs.append(output.detach().clone()))
    expected = []
    for x, y in batches(2):
        snapshot = {f"Net_{name}": parameter.detach().clone() for name, parameter in model.named_parameters()}
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        snapshot.update({f"gradient/Net_{n}": p.grad.detach().clone() for n, p in model.named_parameters()})
        optimizer.step()
        expected.append((snapshot, loss.item()))
    hook.close()

    trial = create_trial(run_dir)
    for step, (snapshot, loss) in enumerate(expected):
        snapshot["relu_output_0"] = relu_outputs[step]
        for name, value in snapshot.items():
            data = as_numpy(value).astype(np.float64)
            tensor = trial.tensor(name)  # listed under its own name although only reductions were saved
            assert tensor.steps() == [0, 1]
            with pytest.raises(TensorUnavailableForStep) as raised:
                tensor.value(step)
            assert raised.value.has_reductions
            for reduction in (*reductions, "l1", "l2"):
                saved = tensor.reduction_value(step, reduction)
                assert saved.dtype == np.float64 and saved.shape == ()
                assert saved == saved_reduction(trial, name, step, reduction)
                # reductions run where the tensor lives, in its dtype (as smdebug's torch path): prod of
                # float32 data is a float32 product (it can underflow where a float64 one would not)
                oracle = ORACLES[reduction](data.astype(np.float32) if reduction == "prod" else data)
                # sums of float32 values that cancel (a CE gradient sums to ~0) are exact only up to
                # float32 rounding of the magnitudes summed
                atol = 1e-6 * float(ORACLES[reduction](np.abs(data))) if reduction in ("sum", "mean") else 0
                np.testing.assert_allclose(saved, oracle, rtol=2e-6, atol=atol, err_msg=f"{name} {reduction}")
            for reduction in ("min", "max", "mean", "sum", "l1", "l2"):
                np.testing.assert_allclose(
                    tensor.reduction_value(step, reduction, abs=True),
                    ORACLES[reduction](np.abs(data)), rtol=2e-6, err_msg=f"{name} abs_{reduction}",
                )  # fmt: skip
            assert tensor.reduction_value(step, "l2_norm") == tensor.reduction_value(step, "l2")
        assert 0 < float(trial.tensor("relu_output_0").reduction_value(step, "zero_fraction")) < 1
        # losses are a scalar collection: always raw, never reduced
        assert float(trial.tensor("CrossEntropyLoss_output_0").value(step)) == loss
    prefixed = trial.tensor_names(show_prefixed_tensors=True)
    assert "smdebug/reductions/l2/Net_fc1.weight" in prefixed
    assert "smdebug/reductions/abs_max/gradient/Net_fc1.weight" in prefixed
    # the loss is raw because it is in "losses"; it also gets the reductions of "outputs", which it is in too
    assert "smdebug/reductions/l2/CrossEntropyLoss_output_0" in prefixed
    assert not any(name.startswith("smdebug/") for name in trial.tensor_names())
    assert "Net_fc1.weight" in trial.tensor_names()


def test_reduction_only_tensor_is_readable_by_its_name(make_hook, run_dir):
    model, criterion, optimizer, hook = _setup(make_hook, reduction_config=tg.ReductionConfig(norms=("l2",)))
    weight = model.fc1.weight.detach().clone()
    _train_steps(model, criterion, optimizer, 1)
    hook.close()
    trial = create_trial(run_dir)
    assert "Net_fc1.weight" in trial.tensor_names()
    tensor = trial.tensor("Net_fc1.weight")
    np.testing.assert_allclose(tensor.reduction_value(0, "l2"), np.linalg.norm(as_numpy(weight).ravel()), rtol=2e-6)
    with pytest.raises(TensorUnavailableForStep) as raised:
        tensor.value(0)
    assert raised.value.has_reductions
    # a loss only in the scalar collection "losses" is saved raw and never reduced
    assert trial.tensor("CrossEntropyLoss_output_0").steps() == [0]
    assert not any("CrossEntropyLoss" in name for name in trial.tensor_names(show_prefixed_tensors=True) if "/" in name)


def test_raw_and_reductions_together_and_per_collection(make_hook, run_dir):
    model, criterion, optimizer, hook = _setup(
        make_hook, reduction_config=tg.ReductionConfig(norms=("l2",), save_raw_tensor=True)
    )
    hook.get_collection("gradients").reduction_config = tg.ReductionConfig(reductions=("max",))
    _train_steps(model, criterion, optimizer, 2)
    hook.close()
    trial = create_trial(run_dir)
    weight = trial.tensor("Net_fc1.weight")
    raw = weight.value(1).astype(np.float64)
    np.testing.assert_allclose(weight.reduction_value(1, "l2"), np.linalg.norm(raw.ravel()), rtol=2e-6)
    assert trial.has_tensor("smdebug/reductions/l2/Net_fc1.weight")
    # reduction_value returns the saved reduction, not one recomputed from the raw value
    assert weight.reduction_value(1, "l2") == saved_reduction(trial, "Net_fc1.weight", 1, "l2")
    # gradients: the collection's own config (reductions only, no raw)
    grads = [
        name for name in trial.tensor_names(show_prefixed_tensors=True) if name.endswith("gradient/Net_fc1.weight")
    ]
    assert grads == ["gradient/Net_fc1.weight", "smdebug/reductions/max/gradient/Net_fc1.weight"]
    gradient = trial.tensor("gradient/Net_fc1.weight")
    with pytest.raises(TensorUnavailableForStep):
        gradient.value(1)
    assert gradient.reduction_value(1, "max") == saved_reduction(trial, "gradient/Net_fc1.weight", 1, "max")


def test_reduction_values_lists_only_the_tensors_own_reductions(make_hook, run_dir):
    model, criterion, optimizer, hook = _setup(
        make_hook, reduction_config=tg.ReductionConfig(norms=("l2",), save_raw_tensor=True)
    )
    _train_steps(model, criterion, optimizer, 1)
    hook.close()
    trial = create_trial(run_dir)
    assert set(trial.tensor("Net_fc1.weight").reduction_values(0)) == {("l2", False)}


# -- user API ---------------------------------------------------------------------------------
def test_save_scalar_and_save_tensor(make_hook, run_dir):
    model, criterion, optimizer, hook = _setup(make_hook, save_config=tg.SaveConfig(save_interval=3))
    mine = []
    for step, (x, y) in enumerate(batches(7)):
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        hook.save_scalar("lr", 0.1 * (step + 1))
        hook.save_scalar("loss_as_tensor", loss)
        value = torch.full((2, 3), float(step))
        mine.append(value)
        hook.save_tensor("my_tensor", value, "custom")
        hook.save_tensor("my_array", np.arange(4) * step)
        optimizer.step()
    hook.close()

    trial = create_trial(run_dir)
    assert trial.steps() == list(range(7))  # scalars are saved on every step, whatever the schedule
    lr = trial.tensor("scalar/lr")
    assert lr.steps() == list(range(7))
    assert [float(lr.value(step)[0]) for step in range(7)] == [0.1 * (step + 1) for step in range(7)]
    loss = trial.tensor("scalar/loss_as_tensor")
    assert loss.steps() == list(range(7))
    assert float(loss.value(3)[0]) == float(trial.tensor("CrossEntropyLoss_output_0").value(3))
    # save_tensor follows the schedule of the collections it goes to
    assert trial.tensor("my_tensor").steps() == [0, 3, 6]
    np.testing.assert_array_equal(trial.tensor("my_tensor").value(6), as_numpy(mine[6]))
    np.testing.assert_array_equal(trial.tensor("my_array").value(3), np.arange(4) * 3)
    assert "my_tensor" in trial.tensor_names(collection="custom")
    assert "my_array" in trial.tensor_names(collection="default")
    assert trial.tensor("Net_fc1.weight").steps() == [0, 3, 6]
    assert trial.tensor_names(collection="scalars") == ["scalar/loss_as_tensor", "scalar/lr"]


def test_save_scalar_from_tensor_equals_loss(make_hook, run_dir):
    model, criterion, optimizer, hook = _setup(make_hook)
    expected = []
    for x, y in batches(3):
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        hook.save_scalar("loss", loss)
        expected.append(loss.item())
        optimizer.step()
    hook.close()
    trial = create_trial(run_dir)
    assert [float(trial.tensor("scalar/loss").value(step)[0]) for step in range(3)] == expected


def test_context_manager_and_idempotent_close(run_dir):
    model = seeded_model()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with tg.Hook(out_dir=str(run_dir), save_config=tg.SaveConfig(save_interval=1)) as hook:
        hook.register_module(model)
        hook.register_loss(criterion)
        _train_steps(model, criterion, optimizer, 3)
    assert (run_dir / END_OF_TRAINING).exists()
    files = sorted(path for path in run_dir.rglob("*") if path.is_file())
    hook.close()
    hook.close()
    # after close the hook is gone: training goes on and nothing more is written
    _train_steps(model, criterion, optimizer, 2, seed=9)
    assert sorted(path for path in run_dir.rglob("*") if path.is_file()) == files
    trial = create_trial(run_dir)
    assert trial.steps() == [0, 1, 2]
    assert trial.training_ended


# -- SageMaker's debughookconfig.json ---------------------------------------------------------
def test_create_from_json_file(tmp_path, run_dir, monkeypatch):
    config = {
        "LocalPath": str(run_dir),
        "S3OutputPath": "s3://bucket/ignored",
        "HookParameters": {
            "save_interval": "100",
            "train.save_interval": "2",
            "eval.save_interval": 1,
            "include_regex": "relu_output_0",
            "include_workers": "one",
            "save_all": "false",
        },
        "CollectionConfigurations": [
            {
                "CollectionName": "weights",
                "CollectionParameters": {"reductions": "l2_norm,max", "save_raw_tensor": False},
            },
            {
                "CollectionName": "acts",
                "CollectionParameters": {"include_regex": "fc1_output_0", "train.save_interval": "5"},
            },
            # SageMaker repeats CollectionName: include_regex accumulates, the last value of a key wins
            {
                "CollectionName": "acts",
                "CollectionParameters": {"include_regex": "fc2_output_0", "train.save_interval": "3"},
            },
            {"CollectionName": "biases", "CollectionParameters": None},
        ],
    }
    path = tmp_path / "debughookconfig.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(path))
    hook = tg.Hook.create_from_json_file()  # path from $SMDEBUG_CONFIG_FILE_PATH
    try:
        assert hook.out_dir == str(run_dir)
        model = seeded_model()
        criterion = nn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        hook.register_module(model)
        hook.register_loss(criterion)
        weights = []
        for x, y in batches(7):
            weights.append(model.fc1.weight.detach().clone())
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        _eval_steps(model, criterion, 3)
    finally:
        hook.close()

    trial = create_trial(run_dir)
    assert trial.steps(TRAIN) == [0, 2, 3, 4, 6]
    assert trial.steps(EVAL) == [0, 1, 2]
    every_other = {TRAIN: [0, 2, 4, 6], EVAL: [0, 1, 2]}
    for name in ("gradient/Net_fc1.weight", "CrossEntropyLoss_output_0", "relu_output_0", "Net_fc1.bias"):
        assert trial.tensor(name).steps(TRAIN) == every_other[TRAIN], name
    assert trial.tensor("gradient/Net_fc1.weight").steps(EVAL) == []
    assert trial.tensor("relu_output_0").steps(EVAL) == [0, 1, 2]
    # both regexes of the repeated collection, on the collection's own TRAIN interval (the last one given)
    assert trial.tensor("fc1_output_0").steps(TRAIN) == [0, 3, 6]
    assert trial.tensor("fc2_output_0").steps(TRAIN) == [0, 3, 6]
    assert trial.tensor("fc1_output_0").steps(EVAL) == [0, 1, 2]  # modes it does not set: the hook's
    assert not trial.has_tensor("Net_output_0")
    assert trial.collection("acts").include_regex == ["fc1_output_0", "fc2_output_0"]
    # weights: reductions only (save_raw_tensor false), in TRAIN and EVAL steps
    weight = trial.tensor("Net_fc1.weight")
    assert weight.steps(TRAIN) == [0, 2, 4, 6]
    assert weight.steps(EVAL) == [0, 1, 2]
    for step in (0, 2, 4, 6):
        expected = as_numpy(weights[step]).astype(np.float64)
        np.testing.assert_allclose(
            weight.reduction_value(step, "l2_norm", mode=TRAIN), np.linalg.norm(expected.ravel()), rtol=2e-6
        )
        assert weight.reduction_value(step, "max", mode=TRAIN) == expected.max()
        with pytest.raises(TensorUnavailableForStep):
            weight.value(step, mode=TRAIN)


def test_json_collection_plain_save_interval(tmp_path, run_dir):
    """§9.1's own example: a collection with ``"save_interval": "500"`` saves on its own schedule."""
    config = {
        "LocalPath": str(run_dir),
        "HookParameters": {"save_interval": "1"},
        "CollectionConfigurations": [{"CollectionName": "gradients", "CollectionParameters": {"save_interval": "3"}}],
    }
    path = tmp_path / "hook.json"
    path.write_text(json.dumps(config))
    hook = tg.Hook.create_from_json_file(str(path))
    try:
        model = seeded_model()
        criterion = nn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        hook.register_module(model)
        hook.register_loss(criterion)
        _train_steps(model, criterion, optimizer, 7)
    finally:
        hook.close()
    trial = create_trial(run_dir)
    assert trial.tensor("Net_fc1.weight").steps() == list(range(7))
    assert trial.tensor("gradient/Net_fc1.weight").steps() == [0, 3, 6]


# -- dtypes -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_tensors_round_trip(make_hook, run_dir, dtype):
    model, criterion, optimizer, hook = _setup(
        make_hook, dtype=dtype, include_collections=["weights", "biases", "gradients", "losses", "outputs"]
    )
    expected = []
    for x, y in batches(2, dtype=dtype):
        weights = model.fc1.weight.detach().clone()
        optimizer.zero_grad()
        output = model(x)
        loss = criterion(output, y)
        loss.backward()
        expected.append(
            (weights, model.fc1.weight.grad.detach().clone(), output.detach().clone(), loss.detach().clone())
        )
        optimizer.step()
    hook.close()

    trial = create_trial(run_dir)
    for step, (weights, grad, output, loss) in enumerate(expected):
        for name, value in (
            ("Net_fc1.weight", weights), ("gradient/Net_fc1.weight", grad), ("Net_output_0", output),
            ("CrossEntropyLoss_output_0", loss),
        ):  # fmt: skip
            saved = trial.tensor(name).value(step)
            if dtype == torch.bfloat16:
                assert saved.dtype == np.float32, name  # bf16 widens exactly to float32
                np.testing.assert_array_equal(saved, as_numpy(value.float()))
            else:
                assert saved.dtype == np.float16, name
                np.testing.assert_array_equal(saved, as_numpy(value))


# -- gradients after clipping -----------------------------------------------------------------
def test_saved_gradient_is_the_clipped_one_the_optimizer_used(make_hook, run_dir):
    """clip_grad_norm_ rewrites .grad in place after backward: the saved gradient must be the
    clipped one the optimizer applied, not the raw one autograd produced."""
    model, criterion, optimizer, hook = _setup(make_hook)
    used = []
    for x, y in batches(3):
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.01)
        used.append(model.fc1.weight.grad.detach().clone())
        optimizer.step()
    hook.close()
    trial = create_trial(run_dir)
    for step, grad in enumerate(used):
        np.testing.assert_array_equal(trial.tensor("gradient/Net_fc1.weight").value(step), as_numpy(grad))


def test_closure_steps_save_the_clipped_gradient_of_every_saved_step(make_hook, run_dir):
    """Lightning's order: optimizer.step(closure) runs the optimizer's pre-hooks before the closure
    does forward, backward and clipping. The pre-hook that takes the applied gradients exists only
    while a step saving gradients is open; steps between saved ones have none."""
    model, criterion, optimizer, hook = _setup(make_hook, save_config=tg.SaveConfig(save_interval=2))
    used = []
    for x, y in batches(5):

        def closure(x=x, y=y):  # type: ignore[no-untyped-def]
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.01)
            used.append(model.fc1.weight.grad.detach().clone())
            return loss

        optimizer.step(closure)
    hook.close()
    trial = create_trial(run_dir)
    assert trial.tensor("gradient/Net_fc1.weight").steps() == [0, 2, 4]
    for step in (0, 2, 4):
        np.testing.assert_array_equal(trial.tensor("gradient/Net_fc1.weight").value(step), as_numpy(used[step]))


def test_save_scalar_after_optimizer_step_belongs_to_that_step(make_hook, run_dir):
    model, criterion, optimizer, hook = _setup(make_hook)
    expected = []
    for x, y in batches(3):
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        hook.save_scalar("loss", loss)  # the usual place: after the step
        expected.append(loss.item())
    hook.close()
    trial = create_trial(run_dir)
    assert trial.steps() == [0, 1, 2]
    assert [float(trial.tensor("scalar/loss").value(step)[0]) for step in range(3)] == expected
