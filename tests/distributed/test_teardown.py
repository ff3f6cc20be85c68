"""Distributed runs under ``trainguard run`` end (issue 48 item 0).

The hang it fixes (py-spy on a rank stuck after "training completed"): the main thread in
``std::thread::join`` under ``~ProcessGroupGloo`` under ``~Reducer`` (DDP's), with the GIL held;
a gloo thread in ``gil_scoped_acquire`` under ``~AsyncAllreduceWork``. The Reducer held the
process group's last reference because the script destroyed the group while its DDP model was
alive (as the PyTorch examples do) and, under trainguard, because the hook's call shim kept the
model alive until the hook's close at exit. The unit tests check both parts of the fix; the
torchrun tests run the examples' program (bench/ddp_teardown.py) as a user runs it, under
``--rules default --rules Straggler --stop-on-issue``.
"""

from __future__ import annotations

import gc
import re
import socket
import sys
import weakref

import pytest
import torch

from tests.distributed._torchrun import dumps, rule_output, torchrun_job
from trainguard.trials import create_trial


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def zero_code_hook(tmp_path, monkeypatch):
    from trainguard.hooks import torch_root_call
    from trainguard.hooks.zero_code import ZeroCodeHook

    monkeypatch.setattr(torch_root_call, "shims_safe", lambda: True)  # roots get call shims
    hook = ZeroCodeHook(out_dir=str(tmp_path / "run"))
    yield hook
    hook.close()


def _train(model: torch.nn.Module, steps: int = 3) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(4, 2)).pow(2).mean().backward()
        optimizer.step()


def test_a_model_the_script_drops_is_freed_while_the_hook_is_open(zero_code_hook):
    """The root's call shim lives in the model's own __dict__; holding the model there was a
    reference cycle that kept it (and a DDP model's Reducer and process group) until the hook's
    close at interpreter exit."""
    model = torch.nn.Linear(2, 1)
    _train(model)
    assert "_compiled_call_impl" in model.__dict__  # driven by a shim
    reference = weakref.ref(model)
    enabled = gc.isenabled()
    gc.disable()  # freed by its reference count, not by a collection that may come much later
    try:
        del model
        assert reference() is None
    finally:
        if enabled:
            gc.enable()


def test_a_process_group_the_script_destroys_is_released_at_exit(zero_code_hook):
    """``destroy_process_group()`` while a DDP model is alive: the group's last reference must
    not be the Reducer's (its deallocation keeps the GIL while joining gloo's threads)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    group = dist.group.WORLD
    model = DistributedDataParallel(torch.nn.Linear(2, 1))
    _train(model)
    from torch.distributed import destroy_process_group  # as scripts import it, after torch

    destroy_process_group()
    assert not dist.is_initialized()  # destroyed for PyTorch as asked
    keeper = zero_code_hook._process_groups
    assert keeper.kept == 1 and keeper._kept[0] is group
    del model, group
    keeper.release()  # what interpreter exit does: the group goes now, with the GIL released
    assert keeper.kept == 0
    zero_code_hook.close()
    assert dist.destroy_process_group is dist.distributed_c10d.destroy_process_group
    assert not hasattr(dist.destroy_process_group, "__wrapped__")  # PyTorch's own again


@pytest.mark.parametrize(
    ("argv", "launcher"),
    [
        (["python", "-m", "torch.distributed.run", "--nproc_per_node", "2", "train.py"], True),
        (["python", "-u", "-m", "torch.distributed.launch", "train.py"], True),
        (["/usr/bin/python3", "/venv/bin/torchrun", "--standalone", "train.py"], True),
        (["python", "train.py", "--launcher", "torchrun"], False),
        (["python", "-m", "train"], False),
        (["python", "-c", "import torch"], False),
    ],
)
def test_torchruns_agent_arms_no_hook(monkeypatch, argv, launcher):
    from trainguard import zero_code

    monkeypatch.setattr(sys, "orig_argv", argv)
    assert zero_code._is_launcher() is launcher


@pytest.mark.slow
def test_a_two_rank_torchrun_job_under_rules_and_stop_on_issue_ends_and_leaves_nothing(tmp_path):
    record = torchrun_job(tmp_path)
    assert not record["hung"], (record, dumps(tmp_path))
    assert record["returncode"] == 0, record
    assert record["training_s"] is not None, record  # both ranks completed
    assert record["left_behind"] == [], record
    trial = create_trial(str(tmp_path / "run-1"), collection_wait_timeout=0)
    assert trial.training_ended and trial.workers() == ["worker_0", "worker_1"]
    # one writer process per rank: torchrun's agent trains nothing and arms no hook
    writer = re.compile(r"trainguard\.(writer\.child|hooks\.writer_child)")
    writers = [command for command in record["processes"] if writer.search(command)]
    assert len(writers) == 2, record["processes"]
    # healthy: Straggler (profiler step timings of both ranks) stays silent, and so do the replica
    # fingerprints of plain DDP without gradient accumulation (ReplicaDivergence is a default rule)
    assert rule_output(tmp_path, "Straggler")["status"] == "NoIssuesFound", rule_output(tmp_path, "Straggler")
    assert rule_output(tmp_path, "ReplicaDivergence")["status"] == "NoIssuesFound", rule_output(
        tmp_path, "ReplicaDivergence"
    )


@pytest.mark.slow
def test_a_distributed_run_stopped_by_a_rule_leaves_no_process(tmp_path):
    """Rank 1's inputs turn NaN at step 3: ExplodingTensor (certain) stops the job. torchrun
    starts each rank in a session of its own, out of the process group trainguard signals.
    Training would last 960 steps: at a load of 10 on two cores the rules' stop once came after
    20 epochs (320 steps, 16 s) had ended; a stopped run ends at the stop, not later."""
    record = torchrun_job(tmp_path, "--nan-at", "1:3", "--epochs", "60")
    assert not record["hung"], (record, dumps(tmp_path))
    assert record["returncode"] == 3, record  # stopped by a rule
    assert record["training_s"] is None, record  # it did not train to the end
    assert record["left_behind"] == [], record
