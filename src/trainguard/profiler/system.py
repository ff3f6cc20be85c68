"""Sampling the machine: CPU per core, I/O wait, memory, disk and network I/O, GPUs.

Sources, chosen once at construction:

* **Linux: /proc**, always (``/proc/stat``, ``/proc/meminfo``, ``/proc/diskstats``,
  ``/proc/net/dev``). It needs nothing installed, gives I/O wait per core, and one sample costs
  four small file reads (tens of µs). psutil reads the same files with more overhead.
* **Elsewhere: psutil** when installed (``pip install 'trainguard[profiler]'``); without it, CPU
  and memory are not sampled there (GPUs still are).
* **GPUs: NVML** through ``nvidia-ml-py`` (``import pynvml``) when it is installed and a driver
  answers; otherwise no GPU records are written (never an error).

Rates (CPU %, bytes per second) are computed between consecutive samples, so the first sample
only primes the counters and writes nothing but memory and GPU values.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from trainguard.profiler import layout as L

__all__ = ["GpuSampler", "HostSampler", "Metric"]

logger = logging.getLogger("trainguard")
Metric = tuple[str, str, str, float]  # (Type, Name, Dimension, Value)


_FDS: dict[str, int] = {}


def _read(path: str) -> str:
    """A /proc file's current text. The descriptor stays open: a positional read at offset 0
    regenerates the content, and skips the open/close that would cost most of the time."""
    fd = _FDS.get(path)
    if fd is None:
        fd = _FDS[path] = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    chunks = []
    offset = 0
    while True:
        chunk = os.pread(fd, 1 << 16, offset)
        chunks.append(chunk)
        if len(chunk) < 1 << 16:
            return b"".join(chunks).decode("ascii", errors="replace")
        offset += len(chunk)


def _proc_cpu_times() -> dict[str, tuple[float, float, float]]:
    """{"cpu": (busy, iowait, total), "cpu0": ...} in jiffies since boot."""
    out = {}
    for line in _read("/proc/stat").splitlines():
        if not line.startswith("cpu"):
            break
        parts = line.split()
        values = [float(v) for v in parts[1:9]]  # user nice system idle iowait irq softirq steal
        values += [0.0] * (8 - len(values))
        total = sum(values)  # guest time is already inside user/nice
        idle, iowait = values[3], values[4]
        out[parts[0]] = (total - idle - iowait, iowait, total)
    return out


_MEMINFO = re.compile(r"^(MemTotal|MemAvailable|MemFree):\s+(\d+)", re.MULTILINE)


def _proc_memory() -> tuple[float, float]:
    """(used bytes, used %)."""
    fields = {key: float(value) * 1024 for key, value in _MEMINFO.findall(_read("/proc/meminfo"))}
    total = fields.get("MemTotal", 0.0)
    available = fields.get("MemAvailable", fields.get("MemFree", 0.0))
    used = max(0.0, total - available)
    return used, (100.0 * used / total if total else 0.0)


def _whole_disks() -> set[str] | None:
    try:
        return {name for name in os.listdir("/sys/block") if not name.startswith(("loop", "ram", "zram"))}
    except OSError:
        return None


def _proc_disk_bytes(disks: set[str] | None) -> tuple[float, float]:
    read = written = 0.0
    for line in _read("/proc/diskstats").splitlines():
        parts = line.split()
        if len(parts) < 10:
            continue
        name = parts[2]
        if disks is not None and name not in disks:
            continue  # partitions would count the same bytes twice
        if disks is None and name[-1:].isdigit():
            continue
        read += float(parts[5]) * 512
        written += float(parts[9]) * 512
    return read, written


def _proc_net_bytes() -> tuple[float, float]:
    received = sent = 0.0
    for line in _read("/proc/net/dev").splitlines()[2:]:
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            continue
        parts = rest.split()
        if len(parts) >= 9:
            received += float(parts[0])
            sent += float(parts[8])
    return received, sent


class HostSampler:
    """CPU, I/O wait, memory, disk and network of this machine."""

    def __init__(self) -> None:
        self.source = "none"
        self._read_counters: Callable[[], dict[str, Any]] | None = None
        if sys.platform.startswith("linux") and os.path.exists("/proc/stat"):
            self.source = "proc"
            self._disks = _whole_disks()
            self._read_counters = self._proc_counters
        else:
            try:
                import psutil  # noqa: F401
            except ImportError:
                logger.info("trainguard profiler: no /proc and no psutil; CPU and memory are not sampled")
            else:
                self.source = "psutil"
                self._read_counters = self._psutil_counters
        self._previous: dict[str, Any] | None = None

    def _proc_counters(self) -> dict[str, Any]:
        return {
            "cpu": _proc_cpu_times(),
            "memory": _proc_memory(),
            "disk": _proc_disk_bytes(self._disks),
            "net": _proc_net_bytes(),
        }

    @staticmethod
    def _psutil_counters() -> dict[str, Any]:
        import psutil

        cpu = {}
        per_core = psutil.cpu_times(percpu=True)
        for index, times in enumerate([psutil.cpu_times(), *per_core]):
            values = times._asdict()
            iowait = values.get("iowait", 0.0)
            idle = values.get("idle", 0.0)
            total = sum(v for k, v in values.items() if k not in ("guest", "guest_nice"))
            cpu["cpu" if index == 0 else f"cpu{index - 1}"] = (total - idle - iowait, iowait, total)
        memory = psutil.virtual_memory()
        disk = psutil.disk_io_counters()
        net = psutil.net_io_counters()
        return {
            "cpu": cpu,
            "memory": (float(memory.total - memory.available), float(memory.percent)),
            "disk": (float(disk.read_bytes), float(disk.write_bytes)) if disk else (0.0, 0.0),
            "net": (float(net.bytes_recv), float(net.bytes_sent)) if net else (0.0, 0.0),
        }

    def sample(self, now: float) -> list[Metric]:
        if self._read_counters is None:
            return []
        current = self._read_counters()
        current["time"] = now
        previous, self._previous = self._previous, current
        used_bytes, used_percent = current["memory"]
        metrics: list[Metric] = [
            ("cpu", "MemoryUsedPercent", L.MEMORY_ALGORITHM, used_percent),
            ("memory", "memory", L.MEMORY_USED_BYTES, used_bytes),
        ]
        if previous is None:
            return metrics
        for name, (busy, iowait, total) in current["cpu"].items():
            if name not in previous["cpu"]:
                continue
            old_busy, old_iowait, old_total = previous["cpu"][name]
            span = total - old_total
            busy_pct = 100.0 * (busy - old_busy) / span if span > 0 else 0.0
            wait_pct = 100.0 * (iowait - old_iowait) / span if span > 0 else 0.0
            busy_pct, wait_pct = min(100.0, max(0.0, busy_pct)), min(100.0, max(0.0, wait_pct))
            if name == "cpu":
                metrics += [
                    ("cpu", "cpu", L.TOTAL_CPU_UTILIZATION, busy_pct),
                    ("cpu", "cpu", L.TOTAL_IO_WAIT, wait_pct),
                ]
            else:
                metrics += [("cpu", name, L.CPU_UTILIZATION, busy_pct), ("cpu", name, L.IO_WAIT, wait_pct)]
        elapsed = now - previous["time"]
        if elapsed > 0:
            for kind, key, dimensions in (
                ("disk", "disk", (L.DISK_READ, L.DISK_WRITE)),
                ("network", "net", (L.NET_RECEIVE, L.NET_TRANSMIT)),
            ):
                for index, dimension in enumerate(dimensions):
                    rate = max(0.0, (current[key][index] - previous[key][index]) / elapsed)
                    metrics.append((kind, kind, dimension, rate))
        return metrics


class GpuSampler:
    """Utilization and memory of every GPU NVML sees; empty when NVML is not available."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
        except Exception as error:  # noqa: BLE001 - no package, no driver, no GPU: no GPU metrics
            logger.debug("trainguard profiler: no GPU metrics (%s)", error)

    @property
    def count(self) -> int:
        return len(self._handles)

    def sample(self) -> list[Metric]:
        metrics: list[Metric] = []
        for index, handle in enumerate(self._handles):
            rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            metrics.append(("gpu", f"gpu{index}", L.GPU_UTILIZATION, float(rates.gpu)))
            percent = 100.0 * memory.used / memory.total if memory.total else 0.0
            metrics.append(("gpu", f"gpu{index}", L.GPU_MEMORY_UTILIZATION, percent))
        return metrics

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self._nvml = None
            self._handles = []
