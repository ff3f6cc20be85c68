"""LossNotDecreasing's "risen above its start" check: a training loss that rose at once and stayed
up beyond its own noise is a certain finding (a word-level tanh-RNN language model at a far too
high learning rate), while healthy runs whose first loss happens to be a low draw, noisy runs and
the same model at a sane learning rate stay silent.

The faulty runs here fail without the check: their reference window is already up when the
window comparison starts, so it sees no rise (and the run-end plateau verdict is never certain).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.rules.synthetic import evaluate_rule, first_firing, open_trial, write_run

REPO = Path(__file__).resolve().parents[2]
LOSS = "CrossEntropyLoss_output_0"

# PyTorch's word_language_model example in small: hidden state carried across batches (detached),
# gradients clipped, a hand-written SGD update; synthetic text where each word has three likely
# successors. Its default learning rate 20 with clipping at 0.25 learns; lr 50 unclipped diverges.
LM_SCRIPT = """
import sys, torch, torch.nn as nn
lr, clip, steps = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
V, bptt, batch, hidden = 300, 10, 8, 32
g = torch.Generator().manual_seed(1)
successors = torch.randint(0, V, (V, 3), generator=g)
n = (steps * bptt + 1) * batch
pick, jump = torch.randint(0, 3, (n,), generator=g), torch.rand(n, generator=g)
anywhere = torch.randint(0, V, (n,), generator=g)
words, word = [], 0
for i in range(n):
    words.append(word)
    word = int(successors[word, pick[i]]) if jump[i] < 0.9 else int(anywhere[i])
data = torch.tensor(words).view(batch, -1).t().contiguous()

class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(V, hidden)
        self.rnn = nn.RNN(hidden, hidden, nonlinearity="tanh")
        self.decoder = nn.Linear(hidden, V)

    def forward(self, tokens, state):
        output, state = self.rnn(self.embedding(tokens), state)
        return self.decoder(output), state

model, criterion = LM(), nn.CrossEntropyLoss()
state = torch.zeros(1, batch, hidden)
for step in range(steps):
    tokens, targets = data[step * bptt:(step + 1) * bptt], data[step * bptt + 1:(step + 1) * bptt + 1]
    state = state.detach()
    model.zero_grad()
    output, state = model(tokens, state)
    loss = criterion(output.view(-1, V), targets.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    for parameter in model.parameters():
        parameter.data.add_(parameter.grad, alpha=-lr)
"""


def _trainguard(tmp_path: Path, *args: str, rules: str | None) -> tuple[Path, subprocess.CompletedProcess]:
    script = tmp_path / "tanh_lm.py"
    script.write_text(LM_SCRIPT)
    out = tmp_path / "run"
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    options = ["--rules", rules, "--stop-on-issue"] if rules else []
    result = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "run", "--out", str(out), *options, "--",
         sys.executable, str(script), *args],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    return out, result


def _findings(run: str | Path) -> list:
    return [result for result in evaluate_rule(open_trial(run), "LossNotDecreasing") if result.fired]


def test_a_loss_that_rose_at_once_and_stayed_up_is_certain(tmp_path):
    rng = np.random.default_rng(0)
    # 2.3 at step 0, then a noisy level about 4 (10 % noise): the windows are all up already
    values = [2.3] + [4.0 * (1 + rng.normal(0, 0.1)) for _ in range(60)]
    fired = _findings(write_run(tmp_path / "run", {s: {LOSS: v} for s, v in enumerate(values)}))
    assert fired, "a loss that rose above its start and stayed there"
    first = fired[0]
    assert first.certain and first.details["losses"][LOSS]["kind"] == "risen", first.details
    assert first.step <= 2 * 8 + 10  # as soon as two windows after the start are judged
    assert "learning rate" in first.fix_hint and "above its start" in first.message


@pytest.mark.parametrize("seed", range(12))
def test_healthy_runs_with_a_low_first_loss_stay_silent(tmp_path, seed):
    """The first loss is one draw; a lucky low one (here 2 to 3 standard deviations below its level)
    must not make a run that learns slowly look risen."""
    rng = np.random.default_rng(100 + seed)
    steps = int(rng.integers(60, 200))
    heavy = seed % 2 == 0  # batch size 1: exponential per-sample losses, else 15 % Gaussian noise
    values = []
    for step in range(steps):
        level = 0.05 + 2.25 * math.exp(-float(rng.uniform(0.5, 4)) * step / steps)
        values.append(level * (rng.exponential(1.0) if heavy else 1 + rng.normal(0, 0.15)))
    values[0] = 2.3 * (0.2 if heavy else 1 - 0.15 * float(rng.uniform(2, 3)))
    assert first_firing(evaluate_rule(write_run(tmp_path / "run", {s: {LOSS: v} for s, v in enumerate(values)}),
                                      "LossNotDecreasing")) is None  # fmt: skip


def test_a_flat_loss_around_its_start_is_not_risen(tmp_path):
    rng = np.random.default_rng(5)
    values = [math.log(10) * (1 + rng.normal(0, 0.02)) for _ in range(120)]
    fired = _findings(write_run(tmp_path / "run", {s: {LOSS: v} for s, v in enumerate(values)}))
    assert all(result.details["losses"][LOSS]["kind"] != "risen" for result in fired)
    assert not any(result.certain for result in fired)


def test_tanh_rnn_language_model_at_a_far_too_high_learning_rate_is_stopped(tmp_path):
    # LossNotDecreasing alone: under the default set WeightUpdateRatio (updates far above their
    # weights' norm, also a right diagnosis of this learning rate) stops it first, before
    # LossNotDecreasing has two windows of saved losses after the first
    out, result = _trainguard(tmp_path, "50", "1e9", "300", rules="LossNotDecreasing")
    assert result.returncode == 3, result.stdout + result.stderr
    record = json.loads((out / "trainguard-stop.json").read_text())
    assert record["configuration_name"] == "LossNotDecreasing" and record["certain"], record
    assert "above its start" in record["message"]
    # found once two windows of saved losses (every 10th step) follow the first: step 160 on
    assert 160 <= record["step"] <= 260, record


def test_tanh_rnn_language_model_at_its_default_learning_rate_is_silent(tmp_path):
    out, result = _trainguard(tmp_path, "20", "0.25", "200", rules=None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert first_firing(evaluate_rule(open_trial(out), "LossNotDecreasing")) is None
