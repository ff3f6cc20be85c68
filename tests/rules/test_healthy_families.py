"""Healthy training outside the calibration corpus that rules once cried wolf on, through the real
CLI (``trainguard run --rules --stop-on-issue``): every default rule must stay silent, and the
faulty variant must still be stopped.

* a GAN: its discriminator loss rises towards equilibrium (LossNotDecreasing stopped it; the
  discriminator's last input, the generator's samples, read as unnormalised data);
* a VAE: its heads read the encoder's output (NotNormalizedData took it for data);
* knowledge distillation: a KL divergence to a teacher (ClassImbalance took the teacher's
  argmax for labels);
* a tiny language model: next-token labels follow a vocabulary's frequencies (ClassImbalance).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rules.test_reported_runs import _assert_silent, _assert_stopped, _run

HEALTHY = ["gan.py", "vae.py", "distillation.py", "tiny_lm.py"]


@pytest.mark.slow
@pytest.mark.parametrize("script", HEALTHY)
def test_healthy_family_is_not_flagged(tmp_path: Path, script: str) -> None:
    result = _run(tmp_path / "run", f"../healthy_scripts/{script}")
    _assert_silent(result, tmp_path / "run")


@pytest.mark.slow
def test_a_gan_whose_learning_rate_is_far_too_high_is_still_stopped(tmp_path: Path) -> None:
    result = _run(tmp_path / "run", "../healthy_scripts/gan.py", "--steps", "400", "--lr", "1000")
    _assert_stopped(result, tmp_path / "run", 800)
