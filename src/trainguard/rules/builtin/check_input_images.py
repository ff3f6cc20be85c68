"""CheckInputImages: over input image batches accumulated since the start, once ≥ ``threshold_samples``
images were seen, fire if ``∃c: |mean_c(x)| > threshold_mean`` (mean of channel ``c`` over all
other axes; the channel axis is ``channel``).

SageMaker ``rule_to_invoke``: ``CheckInputImages``; parameters ``threshold_mean`` (0.2),
``threshold_samples`` (500), ``regex`` (``".*hybridsequential0_input_0"``, MXNet's name) and
``channel`` (1, NCHW), as documented. Tensors: ``regex`` ∪ the model's 4-D float inputs
(``<root module>_input_N`` of the PyTorch hook, from the ``inputs`` collection), since the
MXNet default name never occurs in PyTorch runs; inputs the hook found not to be data (a
generator's samples fed to a discriminator, a state fed back: ``_data_inputs``) are not images
of the data set. The typical finding is images scaled to [0, 1] only (``ToTensor()`` without
``Normalize``): mean ≈ 0.3–0.5. That is advice (trainguard.rules.advice), not a fault by itself:
many healthy pipelines stop at [0, 1]; it becomes a finding when the run shows a learning symptom.
A channel mean beyond 1 is not: no scaling of pixels to [0, 1] or [-1, 1] and no normalisation
with the data's statistics gives one, so it is pixels fed as stored (0..255). That is a finding
(not advice), reported as soon as it is seen, without waiting for ``threshold_samples`` images
(a mean of 127 is no sampling accident). What cannot be told apart: a 4-D float input that is
not an image and has its own units (a spectrogram in dB), or a model that rescales its own
input as its first layer (Keras ``Rescaling(1/255)``); both are reported as unscaled images.

Padding is not image content. A random crop with zero padding (CIFAR's ``RandomCrop(32,
padding=4)``) before ``Normalize`` fills the borders with ``(0 - mean_c) / std_c``, which shifts a
well-normalised channel's mean (measured: −0.31). So a channel is judged on the pixels outside its
images' constant border rows and columns as well: it fires only when both means, with and without
such borders, are beyond ``threshold_mean``. Images whose background is a constant border (MNIST's
black margins) are judged on their whole area, as before, whenever that mean is within bounds.
What cannot be told apart: a padded crop whose interior is centred but whose padding value is
wrong, and a correct pipeline; both pass.
"""

from __future__ import annotations

import numpy as np

from trainguard.rules.base import MissingTensor, Rule, StepResult
from trainguard.rules.builtin._data_inputs import data_inputs, derived_inputs
from trainguard.rules.builtin._helpers import (
    ChannelStats,
    check_regexes,
    fmt,
    is_complete,
    read_values,
    select,
)
from trainguard.rules.params import Param

# Pixels scaled to [0, 1] or [-1, 1], or normalised with the data's statistics, have channel means
# within 1; a mean beyond it is pixels fed as stored (0..255), whatever sample size shows it.
UNSCALED_MEAN = 1.0


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
        self._inner: dict[str, ChannelStats] = {}  # the same, without constant border rows/columns
        self._seen: set[int] = set()  # a step is counted once, however often it is evaluated
        self._inputs_read = False  # some data input was read (images or not)

    def validate(self) -> None:
        check_regexes(self, "regex")

    def _means(self, name: str, stats: ChannelStats) -> tuple[np.ndarray, np.ndarray]:
        """The channel means with and without constant borders (the whole image where all is border)."""
        means = stats.means()
        inner = self._inner.get(name)
        # a channel off only through constant padding borders is not off (module docstring)
        if inner is not None and inner.count is not None and inner.count.shape == means.shape:
            return means, np.where(inner.count > 0, inner.means(), means)
        return means, means

    def inapplicable(self) -> str | None:
        """The model was fed data, none of it images: the rule has nothing to judge by design."""
        if self._inputs_read and not self._stats:
            return "the model's inputs hold no images (no 4-D floating-point model inputs)"
        return super().inapplicable()

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        derived = derived_inputs(trial)
        names = sorted((set(select(self, step, regex=self.regex)) | set(data_inputs(trial, step))) - derived)
        for name in derived & set(self._stats):
            del self._stats[name]  # found not to be data after it was first read
            self._inner.pop(name, None)
        if step in self._seen:
            names = []
        self._seen.add(step)
        for name, value in read_values(trial, names, step).items():
            self._inputs_read = True
            array = np.asarray(value)
            if array.dtype.kind != "f" or array.ndim != 4:
                continue
            axis = self.channel if self.channel >= 0 else array.ndim + self.channel
            if not 0 < axis < array.ndim:
                continue
            values = array.astype(np.float64)
            if self._stats.setdefault(name, ChannelStats()).add(values, axis):
                self._inner.setdefault(name, ChannelStats()).add(without_constant_borders(values, axis), axis)
        if not self._stats:
            if trial.training_ended and not names:
                return self.missing(step, MissingTensor("input images (4-D model inputs)", "model_inputs"))
            return None
        judged = {name: stats for name, stats in self._stats.items() if stats.samples >= self.threshold_samples}
        for name, stats in sorted(self._stats.items()):
            means, inner_means = self._means(name, stats)
            off = np.minimum(np.abs(means), np.abs(inner_means))
            worst = int(np.argmax(off))
            unscaled = bool(off[worst] > max(self.threshold_mean, UNSCALED_MEAN))
            if name not in judged and not unscaled:
                continue
            if off[worst] > self.threshold_mean:
                scale = " (beyond any scaling of pixels to [0, 1] or [-1, 1]: not preprocessed)" if unscaled else ""
                return self.issue(
                    step,
                    f"input images {name}: channel {worst} has mean {fmt(means[worst])} over {stats.samples} images "
                    f"(|mean| > threshold_mean {fmt(self.threshold_mean)}){scale}",
                    # unscaled pixels are a fault of the pipeline, not a matter of taste: a finding
                    advice=False if unscaled else None,
                    tensor=name,
                    channel=worst,
                    means=means.tolist(),
                    means_without_borders=inner_means.tolist(),
                    samples=stats.samples,
                    unscaled=unscaled,
                )
        if not judged:
            return None
        return self.no_issue(step, tensors=sorted(judged))


def without_constant_borders(images: np.ndarray, channel: int) -> np.ndarray:
    """``images`` (N images, ``channel`` the colour axis, the two other axes spatial) with NaN in
    place of each image's constant border: per image and channel, the rows (columns) from an edge
    inwards whose pixels all hold one value, as padding leaves them. NaN is left out of the means."""
    moved = np.moveaxis(images, channel, 1)  # N, C, H, W (a view)
    rows = np.all(moved == moved[..., :, :1], axis=-1)  # N, C, H: a row of one value
    columns = np.all(moved == moved[..., :1, :], axis=-2)  # N, C, W
    border_rows, border_columns = _from_either_edge(rows), _from_either_edge(columns)
    padding = border_rows[..., :, None] | border_columns[..., None, :]
    return np.moveaxis(np.where(padding, np.nan, moved), 1, channel)


def _from_either_edge(flags: np.ndarray) -> np.ndarray:
    """The positions along the last axis reached from the first or the last one through flags all set."""
    return np.logical_and.accumulate(flags, axis=-1) | np.logical_and.accumulate(flags[..., ::-1], axis=-1)[..., ::-1]
