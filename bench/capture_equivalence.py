"""What a capture holds, printed so that two trees' captures can be compared line by line.

Runs two small captures with the ``trainguard`` the running Python imports (so run it once with
each tree's interpreter) and prints, read back with the trial API, every tensor's name, its steps,
the mode of each, its workers and a checksum of its values; timestamps and file names aside:

* ``mlp``: bench/stacks/mlp.py under ``trainguard run`` (zero code change) at a fixed interval;
* ``api``: a model with functional activations under the API hook (``save_all``), TRAIN and EVAL
  steps, an accumulation window of two forwards per optimizer step, and an explicit scalar.

    python bench/capture_equivalence.py > /tmp/a.txt            # this tree
    /other/venv/bin/python bench/capture_equivalence.py --tree /other > /tmp/b.txt
    diff /tmp/a.txt /tmp/b.txt                                    # must be empty
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def capture_mlp(out_dir: Path, steps: int, tree: Path) -> None:
    command = [sys.executable, "-m", "trainguard", "run", "--out", str(out_dir), "--save-interval", "25", "--",
               sys.executable, "-m", "bench.stacks.mlp", "--steps", str(steps)]  # fmt: skip
    subprocess.run(command, cwd=tree, check=True, stdout=subprocess.DEVNULL)


def capture_api(out_dir: Path) -> None:
    import torch
    import torch.nn.functional as F
    from torch import nn

    import trainguard.pytorch as tg

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(torch.tanh(F.relu(self.fc1(x))))

    torch.manual_seed(0)
    model, loss_fn = Net(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    collections = ["weights", "biases", "gradients", "losses", "all", "relu_output", "tanh_input", "tanh_output"]
    hook = tg.Hook(out_dir=str(out_dir), save_all=True, include_collections=collections,
                   save_config=tg.SaveConfig(save_interval=3))  # fmt: skip
    hook.register_module(model)
    hook.register_loss(loss_fn)
    data, labels = torch.randn(64, 8), torch.randint(0, 3, (64,))
    for epoch in range(2):
        hook.set_mode(tg.modes.TRAIN)
        model.train()
        for batch in range(8):
            for half in range(2):  # two forwards per optimizer step: one step
                rows = slice(batch * 8 + half * 4, batch * 8 + half * 4 + 4)
                loss_fn(model(data[rows]), labels[rows]).backward()
            optimizer.step()
            optimizer.zero_grad()
            hook.save_scalar("epoch_batch", epoch * 100 + batch)
        hook.set_mode(tg.modes.EVAL)
        model.eval()
        with torch.no_grad():
            for batch in range(3):
                loss_fn(model(data[batch * 8 : batch * 8 + 8]), labels[batch * 8 : batch * 8 + 8])
    hook.close()


def checksum(array: np.ndarray) -> str:
    array = np.ascontiguousarray(array)
    return hashlib.sha256(str(array.dtype).encode() + str(array.shape).encode() + array.tobytes()).hexdigest()[:16]


def describe(out_dir: Path) -> list[str]:
    from trainguard.trial import create_trial

    trial = create_trial(str(out_dir))
    lines = [f"workers {trial.workers()} modes {[str(mode) for mode in trial.modes()]}"]
    for name in sorted(trial.tensor_names()):
        tensor = trial.tensor(name)
        for step in tensor.steps():
            workers = tensor.workers(step)
            for worker in workers:
                value = tensor.value(step, worker=worker)
                lines.append(f"{name} step={step} mode={trial.mode(step)} mode_step={trial.mode_step(step)} "
                             f"worker={worker} {checksum(value)}")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="steps of the mlp stack")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose bench/stacks run")
    parser.add_argument("--captures", nargs="+", default=["mlp", "api"], choices=["mlp", "api"])
    args = parser.parse_args()
    import trainguard

    print(f"# trainguard from {Path(trainguard.__file__).parent.parent.parent}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.captures:
            out_dir = Path(scratch) / name
            capture_mlp(out_dir, args.steps, args.tree) if name == "mlp" else capture_api(out_dir)
            lines = describe(out_dir)
            digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
            print(f"== {name}: {len(lines) - 1} tensor values, digest {digest}")
            print("\n".join(lines))


if __name__ == "__main__":
    main()
