"""trainguard <-> the real smdebug 1.0.34, both directions.

* smdebug's ``create_trial`` reads a run written by trainguard's PyTorch hook and by its raw
  step writer: same tensor names, steps, modes and values.
* trainguard's trial reads a run written by smdebug's own PyTorch hook, and every dtype written
  by smdebug's low-level writer (including those smdebug itself cannot read back).
"""

from __future__ import annotations

import numpy as np
import pytest

from trainguard.modes import ModeKeys
from trainguard.trials import create_trial

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.interop


def _as_array(described: dict, dtype: str) -> np.ndarray:
    value = np.array(described["value"], dtype=np.complex128 if dtype.startswith("complex") else None)
    if dtype.startswith("complex"):
        raw = np.array(described["value"], dtype=np.float64)
        value = raw[..., 0] + 1j * raw[..., 1] if raw.size else np.zeros(described["shape"], np.complex128)
    return value.reshape(described["shape"]) if value.size or described["shape"] else value


def _train_with_trainguard(out_dir: str) -> dict[int, np.ndarray]:
    import trainguard.pytorch as tg

    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = tg.Hook(
        out_dir,
        save_config=tg.SaveConfig(save_interval=1),
        include_collections=["weights", "biases", "gradients", "losses", "outputs"],
        reduction_config=tg.ReductionConfig(norms=["l2"], reductions=["mean"], save_raw_tensor=True),
    )
    hook.register_module(model)
    hook.register_loss(criterion)
    x, y = torch.randn(12, 6), torch.randint(0, 3, (12,))
    weights = {}
    for step in range(3):
        weights[step] = model[0].weight.detach().clone().numpy()
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        for _ in range(2):
            criterion(model(x), y)
    hook.close()
    return weights


def test_smdebug_reads_a_trainguard_hook_run(tmp_path, read_with_smdebug) -> None:
    run = tmp_path / "run"
    weights = _train_with_trainguard(str(run))
    ours = create_trial(run)
    theirs = read_with_smdebug(run)
    assert theirs["tensor_names"] == ours.tensor_names()
    assert theirs["modes"] == sorted(mode.name for mode in ours.modes())
    assert theirs["workers"] == ["worker_0"]
    assert theirs["steps"]["TRAIN"] == ours.steps(ModeKeys.TRAIN) == [0, 1, 2]
    assert theirs["steps"]["EVAL"] == ours.steps(ModeKeys.EVAL) == [0, 1]
    assert theirs["steps"]["GLOBAL"] == ours.steps() == [0, 1, 2, 3, 4]
    assert {int(k): v for k, v in theirs["step_modes"].items()} == {
        step: [ours.mode(step).name, ours.mode_step(step)] for step in ours.steps()
    }
    assert set(theirs["collection_tensor_names"]["gradients"]) == set(ours.tensor_names(collection="gradients"))
    compared = 0
    for name, described in theirs["tensors"].items():
        assert sorted(int(step) for step in described["values"]) == ours.tensor(name).steps(), name
        for step, value in described["values"].items():
            assert "error" not in value, (name, step, value)
            ours_value = ours.tensor(name).value(int(step))
            assert value["dtype"] == str(ours_value.dtype)
            np.testing.assert_array_equal(_as_array(value, value["dtype"]), ours_value)
            compared += 1
        for step, reductions in described.get("reductions", {}).items():
            for reduction in ("l2", "mean"):
                if reduction in reductions:
                    assert reductions[reduction] == pytest.approx(float(ours.tensor(name).reduction_value(int(step), reduction)), rel=1e-6)
    assert compared > 40
    for step, expected in weights.items():
        np.testing.assert_array_equal(_as_array(theirs["tensors"]["Sequential_0.weight"]["values"][str(step)], "float32"), expected)


def test_smdebug_reads_every_dtype_it_supports_from_trainguard(tmp_path, read_with_smdebug) -> None:
    from trainguard.config.collections import CollectionManager
    from trainguard.format.layout import END_OF_TRAINING, collections_key
    from trainguard.storage import LocalStore
    from trainguard.writer.thread import StepWriter

    arrays = {
        "t_float16": np.array([[0.5, -1.25]], np.float16),
        "t_float32": np.array([1.5, 2.5, -3.0], np.float32),
        "t_float64": np.array([[1e-300, 2.0]], np.float64),
        "t_int32": np.array([-5, 7], np.int32),
        "t_int64": np.array([2**40, -3], np.int64),
        "t_uint8": np.array([0, 255], np.uint8),
        "t_bool": np.array([True, False, True]),
        "t_complex128": np.array([1 + 2j], np.complex128),
        "t_scalar": np.array(3.25, np.float32),
    }
    store = LocalStore(tmp_path / "raw")
    writer = StepWriter(store, "worker_0")
    writer.write_object(collections_key("worker_0"), CollectionManager.pytorch_defaults().render(1))
    for step, (mode, mode_step) in enumerate([(ModeKeys.TRAIN, 0), (ModeKeys.EVAL, 0), (ModeKeys.TRAIN, 1)]):
        writer.begin_step(step, mode, mode_step)
        for name, array in arrays.items():
            writer.add_tensor(name, array + step if array.dtype != np.bool_ else array, nbytes=array.nbytes)
        writer.end_step()
    writer.write_object(END_OF_TRAINING, b"")
    assert writer.close()
    theirs = read_with_smdebug(tmp_path / "raw")
    assert theirs["steps"]["TRAIN"] == [0, 1] and theirs["steps"]["EVAL"] == [0]
    for name, array in arrays.items():
        for step in range(3):
            described = theirs["tensors"][name]["values"][str(step)]
            assert "error" not in described, (name, described)
            expected = array + step if array.dtype != np.bool_ else array
            assert described["dtype"] == str(expected.dtype)
            np.testing.assert_array_equal(_as_array(described, described["dtype"]), expected)


def test_trainguard_reads_a_smdebug_hook_run(smdebug_hook_run) -> None:
    run_dir, expected = smdebug_hook_run
    reference = expected["smdebug"]
    trial = create_trial(run_dir)
    assert trial.tensor_names() == reference["tensor_names"]
    assert sorted(mode.name for mode in trial.modes()) == reference["modes"]
    assert trial.workers() == reference["workers"]
    for mode_name, steps in reference["steps"].items():
        assert trial.steps(ModeKeys[mode_name]) == steps, mode_name
    for name, described in reference["tensors"].items():
        for step, value in described["values"].items():
            if "error" in value:
                continue
            np.testing.assert_array_equal(trial.tensor(name).value(int(step)), _as_array(value, value["dtype"]))
        for step, reductions in described.get("reductions", {}).items():
            if "error" in reductions:
                continue
            for key, number in reductions.items():
                absolute = key.startswith("abs_")
                reduction = key[4:] if absolute else key
                ours = float(trial.tensor(name).reduction_value(int(step), reduction, abs=absolute))
                assert ours == pytest.approx(number, rel=1e-5, abs=1e-7), (name, step, key)
    losses = expected["training"]
    assert losses  # the writer recorded the training loop's own view too


def test_trainguard_reads_every_dtype_smdebug_wrote(smdebug_raw_run) -> None:
    run_dir, expected = smdebug_raw_run
    trial = create_trial(run_dir)
    checked = 0
    for name, described in expected["tensors"].items():
        dtype = described["dtype"]
        for step, truth in described["steps"].items():
            value = trial.tensor(name).value(int(step))
            if dtype == "str":
                assert list(value) == truth["value"]
            else:
                assert str(value.dtype) == dtype, name
                np.testing.assert_array_equal(value, _as_array(truth, dtype))
            checked += 1
    assert checked >= 10
