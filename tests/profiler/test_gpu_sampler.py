"""GPU sampling through NVML.

This machine has no NVIDIA driver, so NVML itself cannot run here: the first test uses a stand-in
``pynvml`` module (a mock, for that reason only) that answers like NVML does, to check the
records the sampler writes. The second checks the real behaviour here: no driver, no GPU records,
no error.
"""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path

import pytest

from trainguard.profiler import Profiler, read_system_metrics
from trainguard.profiler.system import GpuSampler


def _fake_nvml(utilization: list[int], used: list[int], total: int) -> types.ModuleType:
    module = types.ModuleType("pynvml")
    state = {"initialised": False, "shutdown": False}
    module.state = state  # type: ignore[attr-defined]
    module.nvmlInit = lambda: state.update(initialised=True)  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: state.update(shutdown=True)  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(utilization)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda index: index  # type: ignore[attr-defined]
    module.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=utilization[h], memory=0)  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=used[h], total=total, free=total - used[h])  # type: ignore[attr-defined]
    return module


def test_nvml_values_become_sagemaker_gpu_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_nvml([97, 12], [30 * 2**30, 4 * 2**30], 80 * 2**30)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sampler = GpuSampler()
    assert sampler.count == 2
    assert sampler.sample() == [
        ("gpu", "gpu0", "GPUUtilization", 97.0),
        ("gpu", "gpu0", "GPUMemoryUtilization", 37.5),
        ("gpu", "gpu1", "GPUUtilization", 12.0),
        ("gpu", "gpu1", "GPUMemoryUtilization", 5.0),
    ]
    with Profiler(tmp_path, interval_ms=100, framework=False):
        time.sleep(0.25)
    gpu = [(m.type, m.name, m.dimension, m.value) for m in read_system_metrics(tmp_path) if m.type == "gpu"]
    assert ("gpu", "gpu1", "GPUMemoryUtilization", 5.0) in gpu and len(gpu) % 4 == 0
    assert fake.state["shutdown"]  # NVML is shut down at stop()


def test_without_a_driver_there_are_no_gpu_records(tmp_path: Path) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVML")
    except ImportError:
        pass
    except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound and friends: the case under test
        pass
    assert GpuSampler().count == 0
    with Profiler(tmp_path, interval_ms=100, framework=False):
        time.sleep(0.25)
    metrics = read_system_metrics(tmp_path)
    assert metrics and not any(m.type == "gpu" for m in metrics)
