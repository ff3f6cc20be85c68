"""Train a tiny PyTorch model with smdebug 1.0.34's own hook; record what a reader must see.

Usage (inside the smdebug venv, see tests/interop/smdebug_env.py):
    python write_with_smdebug.py OUT_DIR EXPECTED.json

OUT_DIR gets a real smdebug run (events/, index/, collections/, training_job_end.ts). EXPECTED.json
gets:
  * "smdebug": that run read back with smdebug's own create_trial, in the JSON shape documented
    in read_with_smdebug.py. A trainguard reader pointed at OUT_DIR should reproduce it.
  * "training": values observed directly in the training loop (losses per mode step, parameters
    before each step), an independent check that does not rely on smdebug's reader.
  * "layout": the global steps of each phase, so tests can state expectations plainly.

The run covers: TRAIN steps, then EVAL steps (no gradients saved there), then TRAIN again (mode
steps continue, global steps keep increasing); save_scalar; save_tensor of an int64 tensor;
reductions with and without the raw tensor.
"""

import json
import os
import sys

import numpy as np
import smdebug.pytorch as smd
import torch
import torch.nn as nn
from read_with_smdebug import dump_trial  # same directory: sys.path[0]

TRAIN_STEPS, EVAL_STEPS, TRAIN_AGAIN_STEPS = 4, 2, 2


class Net(nn.Module):
    # A named root class gives smdebug-style names: Net_fc1.weight, gradient/Net_fc1.weight.
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def main(out_dir, expected_path):
    os.environ.pop("TRAINING_JOB_NAME", None)  # set = "SageMaker job": no end marker written
    torch.manual_seed(0)
    x = torch.randn(32, 8)
    y = torch.randint(0, 3, (32,))
    model = Net()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=1),
        include_collections=["weights", "biases", "gradients", "losses", "default"],
    )
    # Reductions on two collections, set before the first step (smdebug fills in the hook's
    # default config only for collections that have none):
    # - gradients: raw tensor AND reductions (reduction_value reads the saved scalar);
    # - biases: reductions only, no raw tensor (value() must fail, reduction_value works).
    hook.get_collection("gradients").reduction_config = smd.ReductionConfig(
        reductions=["max", "mean"], abs_reductions=["mean"], norms=["l2"], save_raw_tensor=True
    )
    hook.get_collection("biases").reduction_config = smd.ReductionConfig(
        reductions=["min", "max", "mean", "std"], norms=["l2"], save_raw_tensor=False
    )
    hook.register_module(model)
    hook.register_loss(criterion)

    training = {"losses": {"TRAIN": {}, "EVAL": {}}, "params_before_step": {}}
    layout = {"TRAIN": [], "EVAL": []}
    global_step = 0
    mode_step = {"TRAIN": 0, "EVAL": 0}

    def record_params():
        # The hook saves weights/biases in the root forward pre-hook: values before the update.
        training["params_before_step"][str(global_step)] = {
            n: p.detach().numpy().tolist() for n, p in model.named_parameters()
        }

    def run(mode_name, n):
        nonlocal global_step
        for _ in range(n):
            record_params()
            if mode_name == "TRAIN":
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                # Scalars are cached and written with the current step.
                hook.save_scalar("lr", optimizer.param_groups[0]["lr"])
            else:
                with torch.no_grad():
                    loss = criterion(model(x), y)
            training["losses"][mode_name][str(mode_step[mode_name])] = loss.item()
            layout[mode_name].append(global_step)
            mode_step[mode_name] += 1
            global_step += 1

    # smdebug's hook starts in GLOBAL mode: set TRAIN explicitly, or nothing is "TRAIN".
    hook.set_mode(smd.modes.TRAIN)
    # save_tensor writes at the next forward pass. Use the built-in "default" collection: a
    # collection first named here would have no reduction config and smdebug 1.0.34 crashes
    # (AttributeError: 'NoneType' object has no attribute 'save_raw_tensor').
    hook.save_tensor("custom_counts", np.arange(6, dtype=np.int64).reshape(2, 3), "default")
    run("TRAIN", TRAIN_STEPS)
    hook.set_mode(smd.modes.EVAL)
    run("EVAL", EVAL_STEPS)
    hook.set_mode(smd.modes.TRAIN)
    run("TRAIN", TRAIN_AGAIN_STEPS)
    hook.close()  # writes the last step and training_job_end.ts

    expected = {"layout": layout, "training": training, "smdebug": dump_trial(out_dir)}
    with open(expected_path, "w") as fh:
        json.dump(expected, fh, indent=1, sort_keys=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
