"""bfloat16 tensors keep the dtype they were trained in: saved as DT_BFLOAT16 (the raw 16 bits),
read back as exact float32 values whose saved dtype is reported as bfloat16."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trainguard.format import saved_dtype  # noqa: E402
from trainguard.format.fast_decode import decode_tensor_event  # noqa: E402
from trainguard.format.tensor_codec import DT_BFLOAT16, decode_event, encode_tensor_event  # noqa: E402
from trainguard.modes import ModeKeys  # noqa: E402


def test_encoded_bfloat16_decodes_exactly_and_reports_its_dtype() -> None:
    values = torch.randn(5, 7, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    bits = values.view(torch.int16).numpy().view(np.uint16)
    payload = encode_tensor_event("w", bits, step=3, mode=ModeKeys.TRAIN, mode_step=3, wall_time=1.0,
                                  proto_dtype=DT_BFLOAT16)
    payload = payload.to_bytes()
    expected = values.float().numpy()  # widening bfloat16 to float32 is exact
    for decode in (decode_event, decode_tensor_event):
        array = decode(payload).value
        assert array.dtype == np.float32 and np.array_equal(array, expected)
        assert saved_dtype(array) == "bfloat16"
        assert saved_dtype(array * 2) == "float32" and saved_dtype(array.copy()) == "float32"  # derived: computed
    plain = encode_tensor_event("x", expected, step=3, mode=ModeKeys.TRAIN, mode_step=3, wall_time=1.0)
    plain = plain.to_bytes()
    assert saved_dtype(decode_tensor_event(plain).value) == "float32"


def test_a_bfloat16_model_keeps_its_dtype_through_capture(tmp_path: Path) -> None:
    import trainguard.pytorch as tg
    from trainguard.trial import create_trial

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(torch.bfloat16)
    hook = tg.Hook(out_dir=str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=1),
                   include_collections=["weights", "outputs", "inputs", "losses"])  # fmt: skip
    hook.register_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs = [torch.randn(16, 8).to(torch.bfloat16) for _ in range(3)]
    for x in inputs:
        loss = model(x).float().pow(2).mean()  # the loss in float32, as mixed precision computes it
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    hook.close()
    trial = create_trial(str(tmp_path / "run"), collection_wait_timeout=0)
    fed = trial.tensor("Sequential_input_0")
    assert fed.saved_dtype(1) == "bfloat16" and np.array_equal(fed.value(1), inputs[1].float().numpy())
    assert trial.tensor("Sequential_0.weight").saved_dtype(0) == "bfloat16"
    assert trial.tensor("Sequential_output_0").saved_dtype(2) == "bfloat16"
    dtypes = {name: trial.tensor(name).saved_dtype(trial.tensor(name).steps()[0]) for name in trial.tensor_names()}
    assert set(dtypes.values()) == {"bfloat16"}, dtypes  # nothing widened on the way to disk
