"""NLPSequenceRatio: for each pair (v, p) of ``token_values`` / ``token_thresholds_percent`` and each input
sequence tensor x at step s: fire if ``100 · count(x_s == v) / size(x_s) > p``.

SageMaker ``rule_to_invoke``: ``NLPSequenceRatio``; parameters ``tensor_regex`` (default
``".*embedding0_input_0"``, MXNet's name), ``token_values`` ("0") and
``token_thresholds_percent`` ("50"), as documented; lists are comma- or semicolon-separated,
one threshold applies to every value. Tensors: ``tensor_regex`` ∪ members of an
``input_sequence`` collection ∪ (when ``tensor_regex`` is the default) the integer-typed module
inputs of the ``inputs`` collection — in PyTorch, the token ids entering an ``nn.Embedding``
(``<path>_input_0``) — other than loss labels. Typical finding: batches padded to a fixed
length that are mostly padding.
"""

from __future__ import annotations

import re

import numpy as np

from trainguard.errors import ConfigError
from trainguard.rules.base import MissingTensor, Rule, StepResult
from trainguard.rules.builtin._helpers import check_regexes, fmt, is_complete, read_values, select
from trainguard.rules.params import Param

DEFAULT_REGEX = ".*embedding0_input_0"
# inputs of segment/position embeddings hold ids that are legitimately constant (BERT's
# token_type_ids are all 0 for single-sentence tasks)
_NOT_TOKENS = re.compile(r"token_type|segment|position", re.IGNORECASE)


def _split(value: object) -> list[str]:
    if isinstance(value, str):
        return [part.strip() for part in value.replace(";", ",").split(",") if part.strip()]
    if isinstance(value, (list, tuple)):
        return [str(part).strip() for part in value]
    return [str(value)]


class NLPSequenceRatio(Rule):
    """Input token sequences dominated by one token (padding, unknown)."""

    rule_name = "NLPSequenceRatio"
    collections = ("model_inputs",)  # the hook's collection of what the model is fed
    fix_hint = (
        "pad to the longest sequence in each batch (or bucket sequences by length) instead of a fixed "
        "length, and check the tokenizer's vocabulary for too many unknown tokens"
    )

    tensor_regex = Param(list, [DEFAULT_REGEX], "regexes of token-id input tensor names", optional=True)
    token_values = Param(str, "0", "token ids to count (e.g. the padding id), comma/semicolon separated")
    token_thresholds_percent = Param(str, "50", "percent of the sequence above which each token fires")

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._integer_inputs: dict[str, bool] = {}

    def validate(self) -> None:
        check_regexes(self, "tensor_regex")
        try:
            self.tokens = [int(float(value)) for value in _split(self.token_values)]
            thresholds = [float(value) for value in _split(self.token_thresholds_percent)]
        except ValueError as error:
            raise ConfigError(
                f"{self.name()}: token_values and token_thresholds_percent must be numbers: {error}"
            ) from None
        if not self.tokens or not thresholds:
            raise ConfigError(f"{self.name()}: token_values and token_thresholds_percent must not be empty")
        if len(thresholds) == 1:
            thresholds *= len(self.tokens)
        if len(thresholds) != len(self.tokens):
            raise ConfigError(
                f"{self.name()}: {len(self.tokens)} token_values but {len(thresholds)} token_thresholds_percent; "
                "give one threshold per token or a single one for all"
            )
        if any(not 0 <= value <= 100 for value in thresholds):
            raise ConfigError(f"{self.name()}: token_thresholds_percent must be percentages between 0 and 100")
        self.thresholds = thresholds

    def _names(self, step: int) -> list[str]:
        trial = self.base_trial
        names = set(select(self, step, collections=["input_sequence"], regex=self.tensor_regex))
        if self.tensor_regex in (None, [DEFAULT_REGEX]):
            labels = set(trial.tensor_names(collection="labels")) if "labels" in trial.collections() else set()
            for name in select(self, step, collections=["inputs"]):
                if name in labels or name.rsplit("_input_", 1)[0].endswith("Loss"):
                    continue
                if _NOT_TOKENS.search(name):
                    continue  # segment (token type) and position ids: one value everywhere is normal
                if self._integer_inputs.get(name, True):
                    names.add(name)
        return sorted(names)

    def inapplicable(self) -> str | None:
        """The model was fed inputs, none of them token ids: not a sequence model's data."""
        if self._integer_inputs and not any(self._integer_inputs.values()):
            return "the model's inputs hold no token ids (no integer model inputs)"
        return super().inapplicable()

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        names = self._names(step)
        ratios: dict[str, dict[int, float]] = {}
        for name, value in read_values(trial, names, step).items():
            array = np.asarray(value)
            integer = array.dtype.kind in "iu"
            self._integer_inputs[name] = integer
            if not integer or array.size == 0:
                continue
            ratios[name] = {
                token: 100.0 * float(np.count_nonzero(array == token)) / array.size for token in self.tokens
            }
        if not ratios:
            if trial.training_ended and not names and step == trial.steps()[-1]:
                return self.missing(
                    step, MissingTensor("token-id inputs (e.g. an nn.Embedding's input)", "model_inputs")
                )
            return None
        for name, by_token in sorted(ratios.items()):
            for token, threshold in zip(self.tokens, self.thresholds, strict=False):
                if by_token[token] > threshold:
                    return self.issue(
                        step,
                        f"token {token} is {fmt(by_token[token])}% of input {name} (threshold {fmt(threshold)}%)",
                        tensor=name,
                        token=token,
                        percent=by_token[token],
                        threshold=threshold,
                        ratios={key: {str(t): v for t, v in value.items()} for key, value in ratios.items()},
                    )
        return self.no_issue(step, ratios={key: {str(t): v for t, v in value.items()} for key, value in ratios.items()})
