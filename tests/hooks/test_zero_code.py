"""Zero code change: unmodified training scripts (examples/zero_code/) run through
``trainguard run`` as real subprocesses, read back with the real reader."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.hooks._util import ZERO_CODE_EXAMPLES
from trainguard.modes import ModeKeys
from trainguard.trials import create_trial

TRAIN, EVAL = ModeKeys.TRAIN, ModeKeys.EVAL
SCRIPTS = ("mlp_cross_entropy", "cnn", "train_with_validation", "functional_loss", "handwritten_loss")


def run_command(
    out: Path, script: Path | str, *script_args: str, save_interval: int | None = 1, config=None
) -> list[str]:
    command = [sys.executable, "-m", "trainguard.cli", "run", "--out", str(out)]
    if save_interval is not None:
        command += ["--save-interval", str(save_interval)]
    if config is not None:
        command += ["--config", str(config)]
    return [*command, "--", sys.executable, str(script), *script_args]


def trainguard_run(
    out: Path, script: Path | str, *script_args: str, save_interval: int | None = 1, config=None, timeout=180
):
    command = run_command(out, script, *script_args, save_interval=save_interval, config=config)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def printed(stdout: str, kind: str) -> dict[int, float]:
    """``<kind> <index> <float.hex>`` lines -> {index: value}."""
    return {int(m.group(1)): float.fromhex(m.group(2)) for m in re.finditer(rf"^{kind} (\d+) (\S+)$", stdout, re.M)}


def optimizer_steps(stdout: str) -> int:
    return int(re.search(r"^optimizer_steps (\d+)$", stdout, re.M).group(1))


def test_examples_contain_no_trainguard():
    for name in SCRIPTS:
        source = (ZERO_CODE_EXAMPLES / f"{name}.py").read_text()
        assert "import trainguard" not in source and "from trainguard" not in source, name


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every example run once under capture, all at once (each takes ~3-6 s alone)."""
    started = {}
    for name in SCRIPTS:
        out = tmp_path_factory.mktemp(name) / "run"
        command = run_command(out, ZERO_CODE_EXAMPLES / f"{name}.py")
        started[name] = (
            out,
            command,
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
        )
    results = {}
    try:
        for name, (out, command, process) in started.items():
            stdout, stderr = process.communicate(timeout=300)
            results[name] = (out, subprocess.CompletedProcess(command, process.returncode, stdout, stderr))
    finally:
        for _, _, process in started.values():
            if process.poll() is None:
                process.kill()
    return results


def _checked(runs, name):
    out, result = runs[name]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "capture disabled" not in result.stderr, result.stderr[-3000:]
    return out, result, create_trial(out, collection_wait_timeout=0)


@pytest.mark.parametrize(
    ("name", "root", "loss", "activations"),
    [
        (
            "mlp_cross_entropy",
            "MLP",
            "CrossEntropyLoss_output_0",
            ["fc1_output_0", "act_output_0", "fc2_output_0", "MLP_output_0"],
        ),
        (
            "cnn",
            "CNN",
            "NLLLoss_output_0",
            ["conv1_output_0", "conv2_output_0", "pool_output_0", "fc_output_0", "CNN_output_0"],
        ),
        (
            "train_with_validation",
            "Sequential",
            "MSELoss_output_0",
            ["0_output_0", "1_output_0", "2_output_0", "Sequential_output_0"],
        ),
        ("functional_loss", "Sequential", "loss_cross_entropy_output_0", ["0_output_0", "1_output_0", "2_output_0"]),
        (
            "handwritten_loss",
            "Regressor",
            "loss_backward_output_0",
            ["hidden_output_0", "out_output_0", "Regressor_output_0"],
        ),
    ],
)
def test_script_is_captured(runs, name, root, loss, activations):
    out, result, trial = _checked(runs, name)
    steps = optimizer_steps(result.stdout)
    # one TRAIN step per optimizer step
    assert trial.steps(TRAIN) == list(range(steps))
    assert trial.training_ended
    assert trial.workers() == ["worker_0"]
    names = set(trial.tensor_names())
    weights = set(trial.tensor_names(collection="weights"))
    biases = set(trial.tensor_names(collection="biases"))
    gradients = set(trial.tensor_names(collection="gradients"))
    assert weights and biases and all(w.startswith(f"{root}_") for w in weights | biases)
    assert gradients == {f"gradient/{name}" for name in weights | biases}
    assert set(activations) <= names
    assert trial.tensor_names(collection="losses") == [loss]
    # every TRAIN step has the weights, gradients and loss
    for step in range(steps):
        at_step = set(trial.tensor_names(step=step, mode=TRAIN))
        assert weights | biases | gradients | {loss} <= at_step, (step, sorted(at_step))
    # the captured losses are exactly the values the script printed
    train_losses = printed(result.stdout, "train_loss")
    assert len(train_losses) == steps
    captured = trial.tensor(loss)
    assert {step: float(captured.value(step, mode=TRAIN)) for step in range(steps)} == train_losses


def test_functional_loss_is_captured_once(runs):
    _, _, trial = _checked(runs, "functional_loss")
    assert not any("CrossEntropyLoss" in name for name in trial.tensor_names())
    assert not trial.has_tensor("loss_backward_output_0")  # the backward's loss is the functional one


def test_loss_module_internals_are_not_losses(runs):
    _, _, trial = _checked(runs, "mlp_cross_entropy")
    # nn.CrossEntropyLoss calls F.cross_entropy inside: that call is not a second loss
    assert not trial.has_tensor("loss_cross_entropy_output_0")
    assert not trial.has_tensor("loss_backward_output_0")


def test_validation_steps_are_eval_without_gradients(runs):
    _, result, trial = _checked(runs, "train_with_validation")
    val_losses = printed(result.stdout, "val_loss")
    assert trial.modes() == [TRAIN, EVAL]
    # every validation forward is one EVAL step (smdebug's rule outside the optimizer's steps)
    assert trial.steps(EVAL) == sorted(val_losses)
    for step in trial.steps(EVAL):
        at_step = trial.tensor_names(step=step, mode=EVAL)
        assert not any(name.startswith("gradient/") for name in at_step), at_step
        assert "MSELoss_output_0" in at_step and "Sequential_0.weight" in at_step
        assert float(trial.tensor("MSELoss_output_0").value(step, mode=EVAL)) == val_losses[step]
    # epochs alternate: 4 TRAIN steps, then 2 EVAL steps
    assert [trial.mode(step).name for step in trial.steps()[:8]] == ["TRAIN"] * 4 + ["EVAL"] * 2 + ["TRAIN"] * 2


def test_cli_prints_a_summary(runs):
    out, result, trial = _checked(runs, "train_with_validation")
    stdout = result.stdout
    assert f"captured run at {out}" in stdout
    assert re.search(r"steps saved : 18 \(TRAIN 12, EVAL 6\)", stdout), stdout
    tensors = re.search(r"tensors\s*: (\d+) ", stdout)
    assert tensors and int(tensors.group(1)) == len(trial.tensor_names())
    assert re.search(r"data\s*: [\d.]+ (B|KiB|MiB)", stdout)
    assert "losses      : MSELoss_output_0" in stdout
    assert "finished    : yes" in stdout
    assert f"trainguard: capturing to {out}" in result.stderr


def test_summary_command_matches(runs):
    out, _, trial = _checked(runs, "cnn")
    result = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "summary", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert facts["steps"] == len(trial.steps()) == 8
    assert facts["tensors"] == len(trial.tensor_names())
    assert facts["bytes"] > 0 and facts["ended"] is True


def test_save_interval_is_applied(tmp_path):
    out = tmp_path / "run"
    result = trainguard_run(out, ZERO_CODE_EXAMPLES / "mlp_cross_entropy.py", "--steps", "7", save_interval=3)
    assert result.returncode == 0, result.stderr
    trial = create_trial(out)
    assert trial.steps(TRAIN) == [0, 3, 6]
    assert {s: float(trial.tensor("CrossEntropyLoss_output_0").value(s)) for s in (0, 3, 6)} == {
        s: v for s, v in printed(result.stdout, "train_loss").items() if s in (0, 3, 6)
    }


def test_config_file_is_used(tmp_path):
    config = tmp_path / "hook.json"
    config.write_text(
        json.dumps(
            {
                "HookParameters": {"save_steps": "1,2", "include_regex": "fc1_input_0"},
                "CollectionConfigurations": [{"CollectionName": "losses"}, {"CollectionName": "weights"}],
            }
        )
    )
    out = tmp_path / "run"
    result = trainguard_run(
        out, ZERO_CODE_EXAMPLES / "mlp_cross_entropy.py", "--steps", "4", save_interval=None, config=config
    )
    assert result.returncode == 0, result.stderr
    trial = create_trial(out)
    assert trial.steps(TRAIN) == [1, 2]
    names = set(trial.tensor_names())
    assert {"fc1_input_0", "CrossEntropyLoss_output_0", "MLP_fc1.weight"} <= names


# -- the script's exit code and failures --------------------------------------------------------
EXITING_SCRIPT = """
import sys
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    optimizer.zero_grad()
    loss = model(torch.randn(4, 3)).pow(2).mean()
    loss.backward()
    optimizer.step()
print("about to exit", flush=True)
sys.exit(3)
"""


def test_exit_code_is_propagated(tmp_path):
    script = tmp_path / "exits_3.py"
    script.write_text(EXITING_SCRIPT)
    out = tmp_path / "run"
    result = trainguard_run(out, script)
    assert result.returncode == 3, result.stderr
    assert "about to exit" in result.stdout
    # what was captured before the exit is complete and the run is marked finished
    trial = create_trial(out, collection_wait_timeout=0)
    assert trial.steps(TRAIN) == [0, 1]
    assert trial.training_ended
    assert "steps saved : 2" in result.stdout


def test_crashing_script_exit_code(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("import torch\nraise RuntimeError('boom')\n")
    result = trainguard_run(tmp_path / "run", script)
    assert result.returncode == 1
    assert "RuntimeError: boom" in result.stderr


TOUCH_SCRIPT = """
import pathlib, sys
pathlib.Path(sys.argv[1]).write_text("ran")
import torch
"""


@pytest.mark.parametrize(
    ("case", "config_text", "expected"),
    [
        ("invalid json", '{"HookParameters": {"save_interval": "2",}', "not valid JSON"),
        ("unknown key", '{"HookParameters": {"save_intervall": "2"}}', "'save_intervall'"),
        ("bad value", '{"HookParameters": {"save_interval": "abc"}}', "save_interval='abc'"),
        (
            "bad collection key",
            '{"CollectionConfigurations": [{"CollectionName": "weights", "CollectionParameters": {"include": "x"}}]}',
            "'include'",
        ),
        ("bad reduction", '{"HookParameters": {"reductions": "median"}}', "median"),
        ("bad include_workers", '{"HookParameters": {"include_workers": "some"}}', "'some'"),
        ("bad include_regex", '{"HookParameters": {"include_regex": "fc1(("}}', "'fc1(('"),
        ("unknown collection", '{"HookParameters": {"include_collections": "weights,wieghts"}}', "'wieghts'"),
        ("bad bool", '{"HookParameters": {"save_all": "yes"}}', "save_all='yes'"),
        ("missing file", None, "does not exist"),
    ],
)
def test_bad_config_fails_before_the_script_starts(tmp_path, case, config_text, expected):
    script = tmp_path / "touch.py"
    script.write_text(TOUCH_SCRIPT)
    marker = tmp_path / "script_ran"
    config = tmp_path / "hook.json"
    if config_text is not None:
        config.write_text(config_text)
    out = tmp_path / "run"
    result = trainguard_run(out, script, str(marker), config=config, timeout=60)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "trainguard: error:" in result.stderr and expected in result.stderr, result.stderr
    assert not marker.exists(), "the script ran although the config was bad"
    assert not out.exists()


@pytest.mark.parametrize("case", ["save_interval 0", "finished out dir", "out dir under a file"])
def test_bad_cli_arguments_fail_before_the_script_starts(tmp_path, case):
    script = tmp_path / "touch.py"
    script.write_text(TOUCH_SCRIPT)
    marker = tmp_path / "script_ran"
    out = tmp_path / "run"
    save_interval = 1
    if case == "save_interval 0":
        save_interval = 0
    elif case == "finished out dir":
        out.mkdir()
        (out / "training_job_end.ts").write_text("")
    else:
        (tmp_path / "file").write_text("")
        out = tmp_path / "file" / "run"
    result = trainguard_run(out, script, str(marker), save_interval=save_interval, timeout=60)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "trainguard: error:" in result.stderr
    assert not marker.exists(), "the script ran although the arguments were bad"


# -- DataLoader workers in a zero-code run ----------------------------------------------------
FORK_SCRIPT = """
import torch, torch.nn as nn
from torch.utils.data import DataLoader, Dataset

class Augment(nn.Module):
    def forward(self, x):
        return x * 2.0 - 1.0

class Data(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.augment = Augment()
        self.x, self.y = torch.rand(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g)
    def __len__(self):
        return 64
    def __getitem__(self, i):
        with torch.no_grad():
            return self.augment(self.x[i]), self.y[i]

def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = nn.CrossEntropyLoss()
    loader = DataLoader(Data(), batch_size=16, num_workers=2, multiprocessing_context="{context}")
    steps = 0
    for epoch in range(2):  # epoch 0 starts its workers before the first forward, epoch 1 after
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            print(f"train_loss {{steps}} {{loss.item().hex()}}", flush=True)
            steps += 1
    print(f"optimizer_steps {{steps}}")

if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_running_modules_do_not_write(tmp_path, context):
    script = tmp_path / "loader.py"
    script.write_text(FORK_SCRIPT.format(context=context))
    out = tmp_path / "run"
    result = trainguard_run(out, script)
    assert result.returncode == 0, result.stderr
    trial = create_trial(out)
    steps = optimizer_steps(result.stdout)
    assert trial.modes() == [TRAIN]  # the workers' no_grad augmentation forwards made no EVAL steps
    assert trial.steps() == list(range(steps))
    assert not any(name.startswith("Augment") for name in trial.tensor_names())
    assert not list(out.rglob(".*.tmp"))
    losses = printed(result.stdout, "train_loss")
    assert {s: float(trial.tensor("CrossEntropyLoss_output_0").value(s)) for s in range(steps)} == losses


def test_weights_match_a_run_without_capture(tmp_path):
    """Capture does not change the training: same printed losses with and without trainguard."""
    script = ZERO_CODE_EXAMPLES / "functional_loss.py"
    plain = subprocess.run([sys.executable, str(script), "--steps", "5"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    captured = trainguard_run(tmp_path / "run", script, "--steps", "5")
    assert captured.returncode == 0, captured.stderr
    assert printed(plain.stdout, "train_loss") == printed(captured.stdout, "train_loss")
    assert np.isfinite(list(printed(plain.stdout, "train_loss").values())).all()


COMPILED_SCRIPT = """
import sys
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
runner = torch.compile(model, backend="eager") if sys.argv[1] == "compiled" else model
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    optimizer.zero_grad()
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    loss = nn.functional.cross_entropy(runner(x), y)
    loss.backward()
    optimizer.step()
    print("train_loss", step, loss.item().hex())
"""


def test_compiled_model_gets_the_names_and_values_of_the_eager_one(tmp_path):
    """torch.compile's wrapper module is looked through: same tensor names, same losses, as eager."""
    script = tmp_path / "train_compiled.py"
    script.write_text(COMPILED_SCRIPT)
    trials, losses = {}, {}
    for variant in ("eager", "compiled"):
        result = trainguard_run(tmp_path / variant, script, variant)
        assert result.returncode == 0, result.stderr
        trials[variant], losses[variant] = create_trial(tmp_path / variant), printed(result.stdout, "train_loss")
    assert losses["compiled"] == losses["eager"] and len(losses["eager"]) == 4
    eager, compiled = trials["eager"], trials["compiled"]
    assert compiled.tensor_names() == eager.tensor_names()
    assert "Sequential_0.weight" in compiled.tensor_names() and "gradient/Sequential_2.bias" in compiled.tensor_names()
    assert compiled.steps(TRAIN) == eager.steps(TRAIN) == [0, 1, 2, 3]
    for name in ("Sequential_0.weight", "gradient/Sequential_0.weight", "1_output_0"):
        np.testing.assert_array_equal(compiled.tensor(name).value(3), eager.tensor(name).value(3))


AMP_SCRIPT = '''
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
# the scale doubles at every step: the scaled loss rises while the loss falls
scaler = torch.amp.GradScaler("cpu", init_scale=1.0, growth_interval=1)
x, y = torch.randn(32, 8), torch.randn(32, 1)
for step in range(10):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = ((model(x).float() - y) ** 2).mean()  # no loss module, no functional loss
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    print(f"train_loss {step} {loss.item().hex()}")
print("optimizer_steps 10")
'''


def test_a_loss_scaled_for_mixed_precision_is_captured_unscaled(tmp_path):
    """scaler.scale(loss).backward(): the tensor given to backward() is the loss times the
    scaler's scale (here doubled at every step); the loss series must be the loss itself."""
    script = tmp_path / "amp.py"
    script.write_text(AMP_SCRIPT)
    result = trainguard_run(tmp_path / "run", script)
    assert result.returncode == 0, result.stderr[-3000:]
    trial = create_trial(tmp_path / "run")
    assert trial.tensor_names(collection="losses") == ["loss_backward_output_0"]
    captured = trial.tensor("loss_backward_output_0")
    printed_losses = printed(result.stdout, "train_loss")
    assert {step: float(captured.value(step, mode=TRAIN)) for step in range(10)} == printed_losses


ACCUMULATING_SCRIPT = """
import gc
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)

def no_scan(*args, **kwargs):
    raise AssertionError("every object was scanned for an optimizer")

gc.get_objects = no_scan
for step in range(3):
    for micro_batch in range(4):  # gradient accumulation: one step per optimizer.step()
        model(torch.randn(2, 4)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def test_the_optimizer_is_found_without_scanning_every_object(tmp_path):
    """Zero-code capture sees optimizers being created: whether one holds the model's parameters
    (one step per optimizer.step(), accumulation included) is known at the first forward without
    gc.get_objects(), which took 0.12 s of the first step once torch._dynamo was imported."""
    script = tmp_path / "train.py"
    script.write_text(ACCUMULATING_SCRIPT)
    result = trainguard_run(tmp_path / "run", script)
    assert result.returncode == 0, result.stderr
    trial = create_trial(str(tmp_path / "run"))
    assert trial.capture_stopped() == {}, trial.capture_stopped()
    assert trial.steps() == [0, 1, 2]
    assert len(trial.tensor_names(collection="gradients")) == 4
