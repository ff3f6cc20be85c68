"""Where profiler data lives in a run, and what its records look like (SageMaker's layouts).

A run directory (the hook's ``out_dir``) holds the profiler's output under ``profiler-output/``::

    profiler-output/system/incremental/<YYYYMMDDHH>/<minute_epoch_s>.<node>.json
    profiler-output/framework/pevents/<YYYYMMDDHH>/<end_us>_<rank>-<host>_pythontimeline.json

System metric files are JSON lines, one record per metric per sample, exactly SageMaker's
fields: ``{"Type", "Name", "Dimension", "Value", "NodeId", "Timestamp"}``. All records of one
sample carry the same ``Timestamp`` (epoch seconds), which is how a reader groups a snapshot.

Dimensions written (the first four are SageMaker's; the others are trainguard's additions and
are ignored by readers that filter on SageMaker's names):

==================================  ========  ===============  ==================================
Dimension                           Type      Name             Value
==================================  ========  ===============  ==================================
CPUUtilization                      cpu       cpu0, cpu1, ...  busy % of that core
I/OWaitPercentage                   cpu       cpu0, cpu1, ...  % of that core's time in I/O wait
GPUUtilization                      gpu       gpu0, gpu1, ...  NVML utilization.gpu (%)
GPUMemoryUtilization                gpu       gpu0, gpu1, ...  NVML memory used / total (%)
Algorithm                           cpu       MemoryUsedPercent  host memory used (%)
TotalCPUUtilization                 cpu       cpu              busy % over all cores
TotalI/OWaitPercentage              cpu       cpu              I/O wait % over all cores
MemoryUsedBytes                     memory    memory           host memory used (bytes)
DiskReadBytesPerSecond              disk      disk             all whole disks together
DiskWriteBytesPerSecond             disk      disk             all whole disks together
NetworkReceiveBytesPerSecond        network   network          all interfaces but loopback
NetworkTransmitBytesPerSecond       network   network          all interfaces but loopback
==================================  ========  ===============  ==================================

Files rotate per minute (UTC hour folder, minute start in the name). Hours and minutes are
UTC, epoch seconds are 10 digits for any date this code will meet, so byte order of keys is
time order.
"""

from __future__ import annotations

import re
import time

__all__ = [
    "FRAMEWORK_PREFIX",
    "PROFILER_DIR",
    "SYSTEM_PREFIX",
    "framework_key",
    "parse_framework_key",
    "parse_system_key",
    "safe_node_name",
    "system_key",
]

PROFILER_DIR = "profiler-output"
SYSTEM_PREFIX = "system/incremental/"
FRAMEWORK_PREFIX = "framework/pevents/"

# SageMaker's dimension names.
CPU_UTILIZATION = "CPUUtilization"
IO_WAIT = "I/OWaitPercentage"
GPU_UTILIZATION = "GPUUtilization"
GPU_MEMORY_UTILIZATION = "GPUMemoryUtilization"
MEMORY_ALGORITHM = "Algorithm"  # Name "MemoryUsedPercent"
# trainguard's additions.
TOTAL_CPU_UTILIZATION = "TotalCPUUtilization"
TOTAL_IO_WAIT = "TotalI/OWaitPercentage"
MEMORY_USED_BYTES = "MemoryUsedBytes"
DISK_READ = "DiskReadBytesPerSecond"
DISK_WRITE = "DiskWriteBytesPerSecond"
NET_RECEIVE = "NetworkReceiveBytesPerSecond"
NET_TRANSMIT = "NetworkTransmitBytesPerSecond"

_SYSTEM_NAME = re.compile(r"^(?P<minute>\d+)\.(?P<node>.+)\.json$")
_FRAMEWORK_NAME = re.compile(r"^(?P<end_us>\d+)_(?P<rank>\d+)-(?P<host>.+)_pythontimeline\.json$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def safe_node_name(name: str) -> str:
    """A node/host name usable inside file names (dots would make them ambiguous)."""
    return _UNSAFE.sub("-", name).strip("-") or "node"


def hour_folder(epoch_s: float) -> str:
    return time.strftime("%Y%m%d%H", time.gmtime(epoch_s))


def system_key(minute_epoch_s: int, node: str) -> str:
    """Key (relative to ``profiler-output/``) of the system-metrics file of one minute."""
    return f"{SYSTEM_PREFIX}{hour_folder(minute_epoch_s)}/{minute_epoch_s}.{node}.json"


def parse_system_key(key: str) -> tuple[int, str] | None:
    """(minute_epoch_s, node) of a system-metrics key, or None for anything else."""
    match = _SYSTEM_NAME.match(key.rsplit("/", 1)[-1])
    if not match or key.rsplit("/", 1)[-1].startswith("."):
        return None
    return int(match["minute"]), match["node"]


def framework_key(end_us: int, rank: int, host: str) -> str:
    """Key (relative to ``profiler-output/``) of a closed framework timeline file."""
    return f"{FRAMEWORK_PREFIX}{hour_folder(end_us / 1e6)}/{end_us}_{rank}-{host}_pythontimeline.json"


def parse_framework_key(key: str) -> tuple[int, int, str] | None:
    """(end_us, rank, host) of a framework timeline key, or None for anything else."""
    match = _FRAMEWORK_NAME.match(key.rsplit("/", 1)[-1])
    if not match:
        return None
    return int(match["end_us"]), int(match["rank"]), match["host"]
