"""Batch-source targets: label tensors that name where each batch came from, not classes.

A GAN's discriminator is scored on a batch of real samples (targets all 1) and a batch of
generated ones (targets all 0); a domain classifier on a source batch and a target batch. Every
label tensor then holds one value, different tensors different values. Read as classes, the
generator fooling the discriminator (its purpose) looks like "class 1 mispredicted 100 %" or "the
predictions of class 1 are class 0". ClassImbalance and Confusion both ask
:class:`BatchSourceTargets` before judging classes, and say "not evaluated" when it holds.

A classifier fed batches sorted by class (an unshuffled loader) looks the same from the labels
alone and is not judged either.
"""

from __future__ import annotations

import numpy as np

# Batch size 1 is always "constant": a tensor counts only with this many labels; the verdict
# needs this many such tensors read.
SOURCE_BATCH = 8
SOURCE_READS = 4


class BatchSourceTargets:
    """Counts the label tensors read and how many held a single value."""

    def __init__(self) -> None:
        self.sized_reads = 0  # label tensors of >= SOURCE_BATCH labels
        self.constant_reads = 0  # ... of which every label was the same value
        self._values: set[float] = set()

    def add(self, labels: np.ndarray) -> None:
        """One label tensor's class ids (as read for one loss call)."""
        if labels.size < SOURCE_BATCH:
            return
        self.sized_reads += 1
        first = labels.flat[0]
        if bool(np.all(labels == first)):
            self.constant_reads += 1
            self._values.add(float(first))

    def holds(self) -> bool:
        """Every sized label tensor held one value, and not all the same one (that is one class only)."""
        return (self.sized_reads >= SOURCE_READS and self.constant_reads == self.sized_reads
                and len(self._values) >= 2)  # fmt: skip

    def pending(self) -> bool:
        """Every sized label tensor so far held one value, but too few were read to say."""
        return 0 < self.sized_reads < SOURCE_READS and self.constant_reads == self.sized_reads

    def reason(self) -> str:
        return (f"each of the {self.sized_reads} label tensors read holds one value only, different ones "
                "different values: the targets name each batch's source (real or generated samples of a GAN, "
                "a domain), not classes of its examples")  # fmt: skip
