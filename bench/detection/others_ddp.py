"""A 2-rank DDP run of a small GPT-like model under ``torchrun`` (gloo, CPU), as minimal GPT
training scripts write it: token and position embeddings, pre-LayerNorm blocks of causal
self-attention and a GELU MLP, a weight-tied head, AdamW, each rank reading its own random
windows of the text (:func:`markov_text`), the model wrapped in ``DistributedDataParallel``
after the hook has registered it.

The builder launches ``torchrun --nproc_per_node 2`` on this file with a timeout: a run that
does not end in time (issue 48 reports a teardown hang in some DDP runs) is killed with every
process it started, the stacks of each first dumped into ``hang-dump.txt``, and its metrics file
says where each rank was (``hang``), so it is scored as what it is, not lost.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.ddp_teardown import _alive, _descendants, _dump, _kill
from bench.detection.others_common import Capture, OthersSpec, freeze_all, markov_text

VOCAB, BLOCK, DIM, TIMEOUT_S = 200, 16, 32, 420
HANG_DUMP = "hang-dump.txt"  # in the run's directory: the stacks of a run killed for its timeout


def _gpt() -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class CausalSelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_attn = nn.Linear(DIM, 3 * DIM)
            self.c_proj = nn.Linear(DIM, DIM)
            self.n_head = 2

        def forward(self, x):  # type: ignore[no-untyped-def]
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(DIM, dim=2)
            q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
            self.attn = CausalSelfAttention()
            self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

        def forward(self, x):  # type: ignore[no-untyped-def]
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(VOCAB, DIM)
            self.wpe = nn.Embedding(BLOCK, DIM)
            self.h = nn.ModuleList([Block() for _ in range(2)])
            self.ln_f = nn.LayerNorm(DIM)
            self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
            self.wte.weight = self.lm_head.weight  # weight tying
            self.apply(self._init_weights)

        def _init_weights(self, module):  # type: ignore[no-untyped-def]
            if isinstance(module, nn.Linear):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    torch.nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

        def forward(self, idx):  # type: ignore[no-untyped-def]
            pos = torch.arange(0, idx.size(1), dtype=torch.long)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    return GPT()


def _worker(out_dir: str, spec: OthersSpec) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(spec.seed)  # the same initial model on every rank
    log = open(os.path.join(out_dir, f"rank{rank}.log"), "a", encoding="utf-8")  # noqa: SIM115

    def say(what: str) -> None:
        log.write(f"{time.time():.3f} {what}\n")
        log.flush()

    data = torch.from_numpy(markov_text(VOCAB, 20_000))
    rng = np.random.default_rng(1000 * rank + spec.seed)
    model = _gpt()
    criterion = nn.CrossEntropyLoss()
    if spec.freeze:
        freeze_all([model])
    capture = Capture(out_dir, spec)
    capture.start([model], [criterion])
    ddp = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.1)
    say("training")
    try:
        for step in range(spec.steps):
            lr = spec.lr * min(1.0, (step + 1) / 10)  # linear warm-up
            for group in optimizer.param_groups:
                group["lr"] = lr
            starts = rng.integers(0, len(data) - BLOCK - 1, size=16)
            x = torch.stack([data[s : s + BLOCK] for s in starts])
            y = torch.stack([data[s + 1 : s + 1 + BLOCK] for s in starts])
            logits = ddp(x)
            loss = criterion(logits.view(-1, VOCAB), y.view(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            capture.losses.append(float(loss.item()))
        say("trained")
    finally:
        if rank == 0:
            capture.finish()
        else:
            capture.hook.close()
        say("hook closed")
        dist.destroy_process_group()
        say("process group destroyed")
        log.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _dump_and_kill(process: subprocess.Popen[bytes], dump: str) -> None:
    """Where every process of the run is (py-spy where installed, the kernel stacks), then all of
    them killed. torchrun starts each rank in a session of its own, so killing torchrun's group
    alone would leave a hung rank, and the writer process it started, running for ever."""
    try:
        _dump({pid for pid, _ in _descendants(process.pid)} | {process.pid}, Path(dump))
    finally:  # a dump that fails or times out still kills
        tree = _frozen_tree(process.pid)
        os.killpg(process.pid, signal.SIGKILL)
        _kill(tree)
        process.wait()
        deadline = time.monotonic() + 10
        while any(_alive(member) for member in tree) and time.monotonic() < deadline:
            time.sleep(0.05)  # gone, not just signalled: the caller reads the run's directory next


def _frozen_tree(root: int) -> set[tuple[int, str]]:
    """``root`` and its descendants, each stopped (SIGSTOP) until none is left that could start
    another: a rank killed before its child would leave that child to init, out of sight."""
    os.kill(root, signal.SIGSTOP)  # an agent left going could start ranks again
    frozen: set[tuple[int, str]] = set()
    while found := _descendants(root) - frozen:
        for pid, _ in found:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
        frozen |= found
    return frozen


def train_ddp_gpt(out_dir: str, spec: OthersSpec) -> str:
    """``torchrun`` two ranks of :func:`_worker`; a run past ``TIMEOUT_S`` is killed and recorded."""
    from bench.detection.harness import METRICS_FILE

    os.makedirs(out_dir, exist_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(_free_port()), os.path.abspath(__file__), out_dir, json.dumps(asdict(spec))]  # fmt: skip
    environment = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    started = time.time()
    with open(os.path.join(out_dir, "torchrun.log"), "w", encoding="utf-8") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=environment,
                                   start_new_session=True)  # fmt: skip
        try:
            code = process.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _dump_and_kill(process, os.path.join(out_dir, HANG_DUMP))
            code = None
    metrics_path = os.path.join(out_dir, METRICS_FILE)
    if code is None or not os.path.exists(metrics_path):
        ranks = {}
        for rank in (0, 1):
            path = os.path.join(out_dir, f"rank{rank}.log")
            ranks[rank] = open(path, encoding="utf-8").read().splitlines()[-1:] if os.path.exists(path) else []
        hang = {"timed_out": code is None, "exit_code": code, "seconds": round(time.time() - started, 1),
                "last_line_per_rank": ranks, "dump": HANG_DUMP if code is None else None}  # fmt: skip
        if os.path.exists(metrics_path):  # rank 0 finished its metrics; the hang came after
            metrics = json.load(open(metrics_path, encoding="utf-8"))
        else:
            metrics = {"spec": asdict(spec), "losses": [], "nonfinite": False}
        metrics["hang"] = hang
        with open(metrics_path, "w", encoding="utf-8") as file:
            json.dump(metrics, file)
        if not metrics["losses"]:
            raise RuntimeError(f"DDP run did not finish: {hang}")
    return out_dir


if __name__ == "__main__":
    _worker(sys.argv[1], OthersSpec(**json.loads(sys.argv[2])))
