"""Statistics the calibrated loss rules judge with: the noise is measured in the run itself.

Mini-batch losses are noisy (one batch is easy, the next hard), heavy-tailed (batch size 1: most
losses near zero, a few large) and trend while the model learns. Comparing two single values, as
SageMaker's documented conditions do, turns that noise into findings. Here a change counts only
when it stands out of the spread of the values around it:

* :func:`mann_whitney_p` compares two windows by ranks (no assumption on the distribution, one
  outlier moves a rank by one): the one-sided p-value that the later window is higher.
* :func:`decrease_upper_bound` bounds how much a loss fell between two windows (Welch's
  standard error of the difference of means): "the loss fell by at most x %, with 99 % confidence"
  is what says a run did *not* learn, where a noisy run that did learn stays silent.
* :func:`trend_z` is the Mann-Kendall trend statistic of a series (signs of every later-minus-
  earlier pair, normal approximation): negative when the values tend to fall.
* :func:`robust_sd` is the spread of a series from its second differences (median absolute
  value): a linear trend does not move it, a single outlier barely.

Pure functions on sequences of floats, O(window) each: the rules keep the windows themselves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["BestTracker", "decrease_upper_bound", "mann_whitney_p", "mean", "normal_sf", "robust_sd", "trend_z",
           "variance"]

# two-sided 99 % (one-sided 99.5 %) quantile of the standard normal
Z_99 = 2.5758293035489


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def variance(values: Sequence[float]) -> float:
    """Sample variance (n - 1); 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    centre = mean(values)
    return math.fsum((value - centre) ** 2 for value in values) / (len(values) - 1)


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def mann_whitney_p(earlier: Sequence[float], later: Sequence[float]) -> float:
    """One-sided p-value of "``later`` is stochastically greater than ``earlier``".

    Normal approximation of the Mann-Whitney U statistic with the tie correction and a
    continuity correction (accurate from about 8 values per window; conservative below).
    """
    n1, n2 = len(earlier), len(later)
    if n1 == 0 or n2 == 0:
        return 1.0
    pooled = sorted([(value, 0) for value in earlier] + [(value, 1) for value in later])
    ranks = [0.0] * len(pooled)
    ties = 0.0
    index = 0
    while index < len(pooled):
        end = index
        while end + 1 < len(pooled) and pooled[end + 1][0] == pooled[index][0]:
            end += 1
        rank = (index + end) / 2.0 + 1.0
        for position in range(index, end + 1):
            ranks[position] = rank
        size = end - index + 1
        ties += size**3 - size
        index = end + 1
    rank_sum_later = sum(rank for rank, (_, group) in zip(ranks, pooled, strict=True) if group == 1)
    u_later = rank_sum_later - n2 * (n2 + 1) / 2.0
    total = n1 + n2
    expected = n1 * n2 / 2.0
    spread = n1 * n2 / 12.0 * ((total + 1) - ties / (total * (total - 1)))
    if spread <= 0:
        return 1.0  # every value equal: nothing rose
    z = (u_later - expected - 0.5) / math.sqrt(spread)
    return normal_sf(z)


def decrease_upper_bound(start: Sequence[float], current: Sequence[float], z: float = Z_99) -> tuple[float, float]:
    """(relative decrease of the means, its upper confidence bound) from ``start`` to ``current``.

    ``(mean(start) - mean(current)) / |mean(start)|`` and that plus ``z`` Welch standard
    errors: with z = 2.58 the loss fell by less than the bound with 99.5 % confidence.
    """
    reference = mean(start)
    scale = abs(reference) or 1.0
    decrease = (reference - mean(current)) / scale
    error = math.sqrt(variance(start) / len(start) + variance(current) / len(current)) / scale
    return decrease, decrease + z * error


def trend_z(series: Sequence[float]) -> float:
    """The Mann-Kendall statistic of ``series`` as a standard normal z (0 for fewer than 3 values).

    S = sum over i < j of sign(x_j - x_i), variance n(n-1)(2n+5)/18 (no tie correction: losses
    are continuous). z < -1.645 says the series falls, one-sided at 5 %. Ranks only: one outlier
    changes at most n - 1 signs. O(n^2), for windows of a few dozen values.
    """
    values = list(series)
    n = len(values)
    if n < 3:
        return 0.0
    total = 0
    for i in range(n - 1):
        first = values[i]
        for later in values[i + 1:]:
            total += (later > first) - (later < first)
    return total / math.sqrt(n * (n - 1) * (2 * n + 5) / 18)


def robust_sd(series: Sequence[float]) -> float:
    """The noise of one value of ``series``: 1.4826 * median |second difference| / sqrt(6).

    For independent noise of standard deviation s around a smoothly moving level this is about
    s: second differences cancel a linear trend (a steadily rising validation loss is not
    noise), the median ignores the few differences at a turn and an outlier's three.
    """
    if len(series) < 4:
        return 0.0
    values = list(series)
    differences = sorted(abs(values[i + 2] - 2 * values[i + 1] + values[i]) for i in range(len(values) - 2))
    middle = len(differences) // 2
    median = differences[middle] if len(differences) % 2 else (differences[middle - 1] + differences[middle]) / 2
    return 1.4826 * median / math.sqrt(6.0)


class BestTracker:
    """A series judged for "rose above its best, beyond its noise, and stayed there".

    One value per validation pass (or boosting round). Appending is O(1); :meth:`risen` looks
    at the last ``patience`` values and at most ``noise_window`` values for the noise, so its cost
    does not grow with the run.
    """

    def __init__(self, noise_window: int = 64) -> None:
        self.values: list[float] = []
        self.steps: list[int] = []
        self.best_index = -1
        self.noise_window = noise_window

    def add(self, value: float, step: int) -> None:
        self.values.append(value)
        self.steps.append(step)
        if self.best_index < 0 or value < self.values[self.best_index]:
            self.best_index = len(self.values) - 1

    @property
    def best(self) -> float | None:
        return self.values[self.best_index] if self.best_index >= 0 else None

    @property
    def since_best(self) -> int:
        return len(self.values) - 1 - self.best_index if self.best_index >= 0 else 0

    def risen(self, patience: int, delta: float, k: float = 4.0) -> dict[str, float] | None:
        """Facts when the last ``patience`` values (all after the best) are every one above the
        best by more than ``max(delta * |best|, k * noise)``; None otherwise.

        The noise is :func:`robust_sd` of the last ``noise_window`` values (a rise in them only
        makes it larger: conservative). ``k`` = 4: the lowest of a few dozen noisy values lies
        about 2 noise below the series' level, so a later value must be about 2 noise above
        that level; every one of ``patience`` values so, by chance, has odds of about 0.023^patience.
        """
        if self.best_index < 0 or self.since_best < patience:
            return None
        best = self.values[self.best_index]
        noise = robust_sd(self.values[-self.noise_window :])
        margin = max(delta * abs(best), k * noise)
        recent = self.values[-patience:]
        lowest = min(recent)
        if lowest <= best + margin:
            return None
        return {"best": best, "best_step": self.steps[self.best_index], "noise": noise, "margin": margin,
                "lowest_recent": lowest, "latest": recent[-1], "since_best": self.since_best}
