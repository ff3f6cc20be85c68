"""CheckInputImages: over input image batches accumulated since the start, once ≥ ``threshold_samples``
images were seen, fire if ``∃c: |mean_c(x)| > threshold_mean`` (mean of channel ``c`` over all
other axes; the channel axis is ``channel``).

SageMaker ``rule_to_invoke``: ``CheckInputImages``; parameters ``threshold_mean`` (0.2),
``threshold_samples`` (500), ``regex`` (``".*hybridsequential0_input_0"``, MXNet's name) and
``channel`` (1, NCHW), as documented. Tensors: ``regex`` ∪ the model's 4-D float inputs
(``<root module>_input_N`` of the PyTorch hook, from the ``inputs`` collection), since the
MXNet default name never occurs in PyTorch runs. The typical finding is images scaled to
[0, 1] only (``ToTensor()`` without ``Normalize``): mean ≈ 0.3–0.5.
"""

from __future__ import annotations

import numpy as np

from trainguard.rules.base import MissingTensor, Rule, StepResult
from trainguard.rules.builtin._helpers import (
    ChannelStats,
    check_regexes,
    fmt,
    is_complete,
    model_inputs,
    read_values,
    select,
)
from trainguard.rules.params import Param


class CheckInputImages(Rule):
    """Input images whose channels are not centred on zero."""

    rule_name = "CheckInputImages"
    collections = ("model_inputs",)  # the hook's collection of what the model is fed
    fix_hint = "normalise the images per channel with the dataset's mean and standard deviation"
    fix_hints = {
        "pytorch": (
            "normalise the images: torchvision.transforms.Normalize(mean, std) with the dataset's channel statistics"
        ),
        "keras": (
            "normalise the images: keras.layers.Normalization(axis=-1) adapted to the training images, or "
            "Rescaling followed by the dataset's channel mean/std"
        ),
    }

    threshold_mean = Param(
        float,
        0.2,
        "fire when a channel's |mean| is above this",
        check=lambda value: None if value >= 0 else "must be >= 0",
    )
    threshold_samples = Param(
        int, 500, "images to accumulate before judging", check=lambda value: None if value >= 1 else "must be >= 1"
    )
    regex = Param(list, [".*hybridsequential0_input_0"], "regexes of input image tensor names", optional=True)
    channel = Param(int, 1, "axis of the colour channel (1 for NCHW, 3 or -1 for NHWC)")

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._stats: dict[str, ChannelStats] = {}
        self._seen: set[int] = set()  # a step is counted once, however often it is evaluated

    def validate(self) -> None:
        check_regexes(self, "regex")

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        names = sorted(set(select(self, step, regex=self.regex)) | set(model_inputs(trial, step)))
        if step in self._seen:
            names = []
        self._seen.add(step)
        for name, value in read_values(trial, names, step).items():
            array = np.asarray(value)
            if array.dtype.kind != "f" or array.ndim != 4:
                continue
            axis = self.channel if self.channel >= 0 else array.ndim + self.channel
            if not 0 < axis < array.ndim:
                continue
            self._stats.setdefault(name, ChannelStats()).add(array.astype(np.float64), axis)
        if not self._stats:
            if trial.training_ended and not names:
                return self.missing(step, MissingTensor("input images (4-D model inputs)", "model_inputs"))
            return None
        judged = {name: stats for name, stats in self._stats.items() if stats.samples >= self.threshold_samples}
        if not judged:
            return None
        for name, stats in sorted(judged.items()):
            means = stats.means()
            worst = int(np.argmax(np.abs(means)))
            if abs(means[worst]) > self.threshold_mean:
                return self.issue(
                    step,
                    f"input images {name}: channel {worst} has mean {fmt(means[worst])} over {stats.samples} images "
                    f"(|mean| > threshold_mean {fmt(self.threshold_mean)})",
                    tensor=name,
                    channel=worst,
                    means=means.tolist(),
                    samples=stats.samples,
                )
        return self.no_issue(step, tensors=sorted(judged))
