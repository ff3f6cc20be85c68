"""Do distributed runs under ``trainguard run --rules --stop-on-issue`` always end? (issue 48 item 0)

Runs a DDP program written as the PyTorch examples' ``multigpu_torchrun.py`` is (gloo on CPU
here: ``init_process_group``, ``DistributedSampler``, a ``Trainer`` holding the DDP model,
``destroy_process_group()`` while that model is still alive) under

    trainguard run --rules --stop-on-issue -- torchrun --nproc_per_node N <this file> worker ...

``--runs`` times in a row, stdout and stderr read through pipes as a CI job or a test reads them
(a process left holding them keeps the reader waiting even after ``trainguard run`` exited). For
each run it records the training time (the ranks print when training completed), how long after
that the reader saw the end, and the processes of the run still alive after it ended. A run that
outlives its training by ``--allowed-teardown`` seconds counts as hung: every process of the run
is dumped (``py-spy dump --native`` where py-spy exists, ``/proc/<pid>/stack``) into
``--dump-dir`` and then killed.

    python bench/ddp_teardown.py --runs 50 --nproc 2
    python bench/ddp_teardown.py --runs 20 --nproc 4
    python bench/ddp_teardown.py --runs 10 --plain   # the same program without trainguard

``--record`` writes the figures into bench/results.json (bench/RESULTS.md's table).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAINED = re.compile(r"^rank (\d+) training completed at (\d+\.\d+)$", re.M)


def _worker(argv: list[str]) -> None:
    """The published program's shape (CPU, gloo); prints when training completed. Faults for
    tests: ``--nan-at RANK:STEP`` (that rank's inputs become NaN from that step on),
    ``--sleep-at RANK:STEP:SECONDS`` (that rank stalls once before that step),
    ``--slow RANK:FACTOR`` (that rank's every step takes FACTOR times as long: it sleeps
    FACTOR - 1 times its own step's time before the next), ``--step-time SECONDS`` (every rank's
    step works at least that long, padded with a sleep standing in for compute: the 20-input
    model's own step is a millisecond or less, within a loaded machine's scheduling noise)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--nan-at", default="")
    parser.add_argument("--sleep-at", default="")
    parser.add_argument("--slow", default="")
    parser.add_argument("--step-time", type=float, default=0.0)
    options = parser.parse_args(argv)
    rank = int(os.environ["LOCAL_RANK"])
    nan_at = _fault(options.nan_at, rank)
    sleep_at = _fault(options.sleep_at, rank)
    slow = _fault(options.slow, rank)
    import torch
    import torch.nn.functional as F
    from torch.distributed import destroy_process_group, init_process_group
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, Dataset
    from torch.utils.data.distributed import DistributedSampler

    class MyTrainDataset(Dataset):
        def __init__(self, size: int) -> None:
            self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

        def __len__(self) -> int:
            return len(self.data)

        def __getitem__(self, index: int):  # type: ignore[no-untyped-def]
            return self.data[index]

    class Trainer:
        def __init__(self, model: torch.nn.Module, train_data: DataLoader, optimizer: torch.optim.Optimizer) -> None:
            self.rank = int(os.environ["LOCAL_RANK"])
            self.model = DDP(model)
            self.train_data = train_data
            self.optimizer = optimizer

        def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> None:
            self.optimizer.zero_grad()
            loss = F.mse_loss(self.model(source), targets)
            loss.backward()
            self.optimizer.step()

        def train(self, max_epochs: int) -> None:
            step = 0
            for epoch in range(max_epochs):
                self.train_data.sampler.set_epoch(epoch)
                for source, targets in self.train_data:
                    if sleep_at and step == int(sleep_at[0]):
                        time.sleep(float(sleep_at[1]))
                    if nan_at and step >= int(nan_at[0]):
                        source = torch.full_like(source, float("nan"))
                    began = time.perf_counter()
                    self._run_batch(source, targets)
                    padding = options.step_time - (time.perf_counter() - began)
                    if padding > 0:
                        time.sleep(padding)
                    if slow:
                        time.sleep((float(slow[0]) - 1) * (time.perf_counter() - began))
                    step += 1

    init_process_group(backend="gloo")
    dataset = MyTrainDataset(options.size)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(dataset, batch_size=options.batch_size, shuffle=False, sampler=DistributedSampler(dataset))
    trainer = Trainer(model, loader, optimizer)
    trainer.train(options.epochs)
    sys.stdout.write(f"rank {trainer.rank} training completed at {time.time():.3f}\n")
    sys.stdout.flush()
    destroy_process_group()


def _fault(spec: str, rank: int) -> list[str]:
    """``RANK:VALUE[:VALUE]`` -> the values when ``rank`` is that rank, else []."""
    parts = spec.split(":") if spec else []
    return parts[1:] if parts and int(parts[0]) == rank else []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (state, ppid, ...), None when gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as file:
            stat = file.read()
        return stat[stat.rindex(")") + 2 :].split()
    except (OSError, ValueError):
        return None


def _descendants(root: int) -> set[tuple[int, str]]:
    """(pid, start time) of every live descendant of ``root``: the start time tells a process
    from a later one that got its pid."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None and len(fields) > 19 and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append((int(entry), fields[19]))
    found: set[tuple[int, str]] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child[0])
    return found


def _alive(process: tuple[int, str]) -> bool:
    fields = _stat(process[0])
    return fields is not None and len(fields) > 19 and fields[0] != "Z" and fields[19] == process[1]


def _kill(processes: set[tuple[int, str]]) -> None:
    for process in processes:
        if _alive(process):
            try:
                os.kill(process[0], signal.SIGKILL)
            except OSError:
                pass


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


def _dump(pids: set[int], target: Path) -> None:
    """Where every process of a hung run is: py-spy (Python and native frames), the kernel stack."""
    py_spy = shutil.which("py-spy")
    with open(target, "w", encoding="utf-8") as file:
        for pid in sorted(pids):
            file.write(f"=== pid {pid}: {_command_line(pid)}\n")
            if py_spy:
                result = subprocess.run([py_spy, "dump", "--native", "--pid", str(pid)], capture_output=True,
                                        text=True, timeout=60)  # fmt: skip
                file.write(result.stdout + result.stderr)
            try:
                file.write(Path(f"/proc/{pid}/stack").read_text())
            except OSError as error:
                file.write(f"(no kernel stack: {error})\n")


def one_run(args: argparse.Namespace, index: int, work: Path) -> dict:
    """One run of the program (``args``: :func:`build_parser`'s); its record. The run's capture
    is left in ``work/run-<index>``."""
    out = work / f"run-{index}"
    shutil.rmtree(out, ignore_errors=True)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.nproc),
                "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(Path(__file__).resolve()),
                "worker", "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--size", str(args.size),
                "--nan-at", args.nan_at, "--sleep-at", args.sleep_at, "--slow", args.slow,
                "--step-time", str(args.step_time)]  # fmt: skip
    command = torchrun if args.plain else [
        sys.executable, "-m", "trainguard.cli", "run", "--out", str(out), *shlex.split(args.trainguard), "--", *torchrun
    ]  # fmt: skip
    started = time.time()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[tuple[int, str]] = set()
    stop = threading.Event()

    commands: dict[tuple[int, str], str] = {}

    def watch() -> None:  # every process the run started, to look for the ones left behind
        while not stop.wait(0.5):
            for found in _descendants(process.pid) - seen:
                seen.add(found)
                commands[found] = _command_line(found[0])

    completed: dict[int, float] = {}
    lines: list[str] = []
    errors: list[str] = []

    def read_stdout() -> None:
        for line in process.stdout:
            lines.append(line)
            if (match := TRAINED.match(line.strip())) is not None:
                completed[int(match.group(1))] = float(match.group(2))

    threads = [threading.Thread(target=watch, daemon=True), threading.Thread(target=read_stdout, daemon=True),
               threading.Thread(target=lambda: errors.append(process.stderr.read()), daemon=True)]  # fmt: skip
    for thread in threads:
        thread.start()
    hung = False
    while True:
        # The reader sees the end when both pipes closed and trainguard run exited.
        threads[1].join(0.5)
        threads[2].join(0.01)
        if not threads[1].is_alive() and not threads[2].is_alive() and process.poll() is not None:
            break
        now = time.time()
        trained = max(completed.values()) if len(completed) == args.nproc else None
        if now - started > args.training_limit or (trained is not None and now - trained > args.hang_after):
            hung = True
            break
    ended = time.time()
    stop.set()
    threads[0].join(2)
    if hung:
        seen.update(_descendants(process.pid))
        args.dump_dir.mkdir(parents=True, exist_ok=True)
        alive = {pid for pid, started_at in seen if _alive((pid, started_at))} | {process.pid}
        _dump(alive, args.dump_dir / f"hang-{args.nproc}-{index}.txt")
        _kill(seen)
        process.kill()
        process.wait()
        for thread in threads[1:]:
            thread.join(10)
    time.sleep(0.5)  # a process that was exiting as the reader saw the end
    left = sorted(pid for pid, started_at in seen if _alive((pid, started_at)))
    left_commands = [f"{pid} {_command_line(pid)}" for pid in left]
    _kill(seen)
    trained_at = max(completed.values()) if len(completed) == args.nproc else None
    return {
        "run": index,
        "returncode": process.returncode,
        "hung": hung,
        "seconds": round(ended - started, 2),
        "training_s": round(trained_at - started, 2) if trained_at else None,
        "teardown_s": round(ended - trained_at, 2) if trained_at else None,
        "left_behind": left_commands,
        "processes": sorted(commands.values()),
        "stdout_tail": "".join(lines)[-3000:],
        "stderr_tail": "" if process.returncode == 0 and not hung else "".join(errors)[-2000:],
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=1024, help="examples in the data set (all ranks together)")
    parser.add_argument("--plain", action="store_true", help="torchrun alone, without trainguard")
    parser.add_argument("--training-limit", type=float, default=600.0,
                        help="a run still going this long after its start is hung: dumped and killed")  # fmt: skip
    parser.add_argument("--hang-after", type=float, default=60.0,
                        help="a run still going this long after training is hung: dumped and killed")  # fmt: skip
    parser.add_argument("--allowed-teardown", type=float, default=10.0,
                        help="seconds after the last rank's 'training completed' a run may take to end")  # fmt: skip
    parser.add_argument("--dump-dir", type=Path, default=Path(tempfile.gettempdir()) / "ddp-teardown-dumps")
    parser.add_argument("--json", type=Path, help="write every run's record here")
    parser.add_argument("--record", action="store_true", help="write the figures into bench/results.json")
    parser.add_argument("--nan-at", default="", help="RANK:STEP: that rank's inputs are NaN from STEP on")
    parser.add_argument("--sleep-at", default="", help="RANK:STEP:SECONDS: that rank stalls before STEP")
    parser.add_argument("--slow", default="", help="RANK:FACTOR: that rank's steps take FACTOR times as long")
    parser.add_argument("--step-time", type=float, default=0.0,
                        help="every rank's step works at least this long (seconds; a sleep stands in for compute)")  # fmt: skip
    parser.add_argument("--trainguard", default="--rules --stop-on-issue",
                        help="trainguard run's options, one string (default: '--rules --stop-on-issue')")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ddp-teardown-"))
    records = []
    try:
        for index in range(1, args.runs + 1):
            record = one_run(args, index, work)
            del record["processes"], record["stdout_tail"]
            records.append(record)
            late = record["teardown_s"] is None or record["teardown_s"] > args.allowed_teardown
            print(json.dumps(record) + ("  <-- LATE" if late or record["left_behind"] else ""), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    teardowns = [r["teardown_s"] for r in records if r["teardown_s"] is not None]
    bad = [r for r in records if r["hung"] or r["returncode"] != 0 or r["teardown_s"] is None
           or r["teardown_s"] > args.allowed_teardown or r["left_behind"]]  # fmt: skip
    summary = {
        "runs": len(records), "nproc": args.nproc, "plain": args.plain, "ended_in_time": len(records) - len(bad),
        "hung": sum(r["hung"] for r in records), "left_behind": sum(bool(r["left_behind"]) for r in records),
        "teardown_median_s": statistics.median(teardowns) if teardowns else None,
        "teardown_max_s": max(teardowns) if teardowns else None,
        "training_median_s": statistics.median([r["training_s"] for r in records if r["training_s"]] or [0]),
        "load": os.getloadavg()[0],
    }  # fmt: skip
    print(json.dumps(summary), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "runs": records}, indent=1))
    if args.record and not args.plain:
        sys.path.insert(0, str(REPO))
        from bench.results_table import record as record_figure

        record_figure(
            section="Distributed runs end (bench/ddp_teardown.py)",
            figure=f"{args.nproc}-rank torchrun gloo under trainguard run --rules --stop-on-issue: runs that ended "
            f"within {args.allowed_teardown:.0f} s of training, none left behind",
            value=summary["ended_in_time"], unit=f"of {summary['runs']}",
            command=f"nice -n 5 python bench/ddp_teardown.py --runs {args.runs} --nproc {args.nproc} --record",
            note=f"teardown (last rank's 'training completed' -> the reader saw the end) median "
            f"{summary['teardown_median_s']} s, max {summary['teardown_max_s']} s; training median "
            f"{summary['training_median_s']} s; load {summary['load']:.1f}",
        )  # fmt: skip
    return 0 if not bad else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        _worker(sys.argv[2:])
    else:
        sys.exit(main())
