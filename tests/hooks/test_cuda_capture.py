"""Capture from a model on a CUDA device: the same names and values as on the CPU.

Skipped without a GPU (CI has none); run on a GPU machine with
``python -m pytest -q tests/hooks/test_cuda_capture.py``. On CUDA the hook takes another path:
raw tensors are copied to pinned host memory without blocking the stream (the writer thread
waits for the copy's event), and reductions run on the GPU. What could go wrong there: a value
read before its copy finished, a reduction computed on a tensor the optimizer already updated,
a bfloat16 tensor's bits, a compiled model's graph.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import trainguard.pytorch as tg
from trainguard.trials import create_trial

from ._util import batches, seeded_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _capture(make_hook, run_dir, device: str, steps: int = 4, **hook_kwargs):
    # full float32 matmuls on both devices (no TF32), so CPU and GPU values agree to rounding
    torch.backends.cuda.matmul.allow_tf32 = False
    model = seeded_model().to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hook = make_hook(out_dir=str(run_dir / device), save_config=tg.SaveConfig(save_interval=1), **hook_kwargs)
    hook.register_module(model)
    hook.register_loss(criterion)
    for x, y in batches(steps, size=64):
        optimizer.zero_grad()
        criterion(model(x.to(device)), y.to(device)).backward()
        optimizer.step()  # updates in place right after the save: a late copy would read new values
    hook.close()
    return create_trial(str(run_dir / device))


def test_raw_tensors_on_cuda_equal_the_cpu_run(make_hook, run_dir):
    cpu = _capture(make_hook, run_dir, "cpu", save_all=True)
    gpu = _capture(make_hook, run_dir, "cuda", save_all=True)
    assert gpu.tensor_names() == cpu.tensor_names()
    assert gpu.steps() == cpu.steps() == [0, 1, 2, 3]
    for name in cpu.tensor_names():
        for step in cpu.tensor(name).steps():
            expected, saved = cpu.tensor(name).value(step), gpu.tensor(name).value(step)
            assert saved.dtype == expected.dtype and saved.shape == expected.shape, name
            np.testing.assert_allclose(saved, expected, rtol=1e-4, atol=1e-5, err_msg=f"{name} step {step}")


def test_reductions_on_cuda_equal_the_cpu_run(make_hook, run_dir):
    config = dict(
        reduction_config=tg.ReductionConfig(reductions=("min", "max", "mean", "std"), norms=("l1", "l2"),
                                            abs_reductions=("max",), save_raw_tensor=False),
        include_collections=["weights", "biases", "gradients", "outputs"],
    )  # fmt: skip
    cpu = _capture(make_hook, run_dir, "cpu", **config)
    gpu = _capture(make_hook, run_dir, "cuda", **config)
    prefixed = cpu.tensor_names(show_prefixed_tensors=True)
    assert gpu.tensor_names(show_prefixed_tensors=True) == prefixed
    reduced = [name for name in prefixed if name.startswith("smdebug/reductions/")]
    assert len(reduced) >= 20
    for name in reduced:
        for step in cpu.tensor(name).steps():
            np.testing.assert_allclose(gpu.tensor(name).value(step), cpu.tensor(name).value(step),
                                       rtol=1e-4, atol=1e-6, err_msg=f"{name} step {step}")  # fmt: skip


def test_bfloat16_on_cuda_keeps_its_bits(make_hook, run_dir):
    model = nn.Linear(16, 4).to("cuda", torch.bfloat16)
    hook = make_hook(out_dir=str(run_dir), save_config=tg.SaveConfig(save_interval=1), include_collections=["weights"])
    hook.register_module(model)
    expected = model.weight.detach().float().cpu().numpy()
    model(torch.randn(8, 16, device="cuda", dtype=torch.bfloat16)).sum().backward()
    hook.close()
    saved = create_trial(str(run_dir)).tensor("Linear_weight").value(0)
    np.testing.assert_array_equal(np.asarray(saved, dtype=np.float32), expected)


def test_compiled_model_on_cuda_is_captured_like_eager(make_hook, run_dir):
    """Inductor on CUDA (Triton kernels): same names and values as the eager CUDA run."""
    torch._dynamo.reset()
    eager = _capture(make_hook, run_dir, "cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    model = seeded_model().to("cuda")
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hook = make_hook(out_dir=str(run_dir / "compiled"), save_config=tg.SaveConfig(save_interval=1))
    hook.register_module(model)
    hook.register_loss(criterion)
    compiled = torch.compile(model)
    for x, y in batches(4, size=64):
        optimizer.zero_grad()
        criterion(compiled(x.to("cuda")), y.to("cuda")).backward()
        optimizer.step()
    hook.close()
    assert hook.enabled
    trial = create_trial(str(run_dir / "compiled"))
    assert trial.tensor_names() == eager.tensor_names()
    for name in eager.tensor_names():
        for step in eager.tensor(name).steps():
            # inductor fuses differently from eager: agreement to float32 rounding, not bits
            np.testing.assert_allclose(trial.tensor(name).value(step), eager.tensor(name).value(step),
                                       rtol=1e-4, atol=1e-5, err_msg=f"{name} step {step}")  # fmt: skip
