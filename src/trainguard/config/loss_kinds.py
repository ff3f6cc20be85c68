"""Which losses compare predictions with class labels (shared by the PyTorch hook and the rules).

A loss's second input is a class label for classification losses only. Regression targets, a
teacher's distribution (KL-divergence distillation), pair similarities and sequences are not:
integer-valued regression targets or a teacher's argmax would read as classes to ClassImbalance
and Confusion. Any loss not listed here, a user's own (``FocalLoss``) included, is taken as
classification.
"""

from __future__ import annotations

import re

__all__ = ["has_class_targets", "loss_kind_of_tensor"]

_NON_CLASS_TARGET_LOSSES = frozenset({
    # torch.nn modules
    "KLDivLoss", "MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "PoissonNLLLoss", "GaussianNLLLoss",
    "CosineEmbeddingLoss", "MarginRankingLoss", "HingeEmbeddingLoss", "TripletMarginLoss",
    "TripletMarginWithDistanceLoss", "CTCLoss",
    # torch.nn.functional
    "kl_div", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "poisson_nll_loss", "gaussian_nll_loss",
    "cosine_embedding_loss", "margin_ranking_loss", "hinge_embedding_loss", "triplet_margin_loss", "ctc_loss",
})  # fmt: skip


def has_class_targets(loss: str) -> bool:
    """Whether a loss (module class name or ``torch.nn.functional`` name) compares predictions
    with class labels."""
    return loss not in _NON_CLASS_TARGET_LOSSES


def loss_kind_of_tensor(tensor_name: str) -> str | None:
    """The loss a captured loss tensor comes from: ``MSELoss`` for ``MSELoss_output_0``,
    ``mse_loss`` for the zero-code hook's ``loss_mse_loss_output_0``; None for other names."""
    match = re.match(r"^(?:loss_)?([A-Za-z0-9_]+?)_output_\d+$", tensor_name)
    return match.group(1) if match else None
