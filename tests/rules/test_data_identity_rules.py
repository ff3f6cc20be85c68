"""The data rules judge data: not tensors the model produced (collection ``derived_inputs``), not
per-token targets over a vocabulary as classes, and standard preprocessing (row-normalised features,
a graph's adjacency, padded crops normalised afterwards) not as a fault, while broken data
(raw pixels, unscaled features, one label for everything) is still reported."""

from __future__ import annotations

import numpy as np
import pytest

from tests.rules.synthetic import evaluate_rule, first_firing, write_run
from trainguard.rules.builtin._classification import vocabulary_targets
from trainguard.rules.builtin.check_input_images import without_constant_borders

WEIGHT = {"Net_fc.weight": np.ones((2, 2), dtype=np.float32)}  # makes "Net" a root for model_inputs()
LOSS_INPUTS = {"predictions": ["CrossEntropyLoss_input_0"], "labels": ["CrossEntropyLoss_input_1"]}


def _findings(results):
    return [result for result in results if result.fired]


# -- NotNormalizedData: the model's own state is not data ------------------------------------------


def test_not_normalized_data_skips_a_state_the_hook_found_fed_back(tmp_path):
    """An LSTM language model's hidden state (std 0.047) passed back into its forward: filed as
    ``derived_inputs`` by the hook, it is not judged; the same values filed as data are."""
    rng = np.random.default_rng(0)
    steps = {
        step: {**WEIGHT, "Net_input_1": (0.047 * rng.normal(size=(64, 32))).astype(np.float32)}
        for step in range(0, 60, 10)
    }
    as_data = evaluate_rule(write_run(tmp_path / "data", steps, collections={"model_inputs": ["Net_input_1"]}),
                            "NotNormalizedData")  # fmt: skip
    assert first_firing(as_data) == 0 and "std of all values" in _findings(as_data)[0].message
    derived = write_run(tmp_path / "state", steps, collections={"derived_inputs": ["Net_input_1"]})
    results = evaluate_rule(derived, "NotNormalizedData")
    assert first_firing(results) is None
    assert results and results[-1].missing  # nothing left to judge: not evaluated, not "no issues"


# -- NotNormalizedData: standard preprocessing ----------------------------------------------------


def _bag_of_words(rng, nodes=200, words=800):
    counts = (rng.random((nodes, words)) < 0.01).astype(np.float32)
    counts[np.arange(nodes), rng.integers(0, words, nodes)] = 1.0  # no empty row
    return counts


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_row_normalised_features_are_not_squashed_data(tmp_path, norm):
    """``D⁻¹X`` (rows summing to 1) and L2-normalised rows have tiny values because there are many
    features; the pooled-σ bound (oracle: σ < 0.2) fires on the same values when rows are not
    normalised (every row scaled by one constant instead)."""
    rng = np.random.default_rng(1)
    counts = _bag_of_words(rng)
    scale = counts.sum(1, keepdims=True) if norm == "l1" else np.sqrt((counts**2).sum(1, keepdims=True))
    normalised = counts / scale
    assert normalised.std() < 0.2  # the oracle: the unconditional bound would fire
    flat = counts / float(scale.mean())  # as small, but a constant scale: squashed data
    assert flat.std() < 0.2
    for name, features, fires in (("rows", normalised, False), ("flat", flat, True)):
        run = write_run(tmp_path / name, {s: {**WEIGHT, "Net_input_0": features} for s in range(3)},
                        collections={"model_inputs": ["Net_input_0"]})  # fmt: skip
        results = evaluate_rule(run, "NotNormalizedData")
        assert (first_firing(results) is not None) is fires, (name, _findings(results)[:1])


def test_a_graphs_adjacency_next_to_its_node_features_is_not_judged(tmp_path):
    """A symmetric-normalised adjacency N×N beside N×F features relates samples; alone, the same
    matrix is judged (and its small values fire)."""
    rng = np.random.default_rng(2)
    nodes = 150
    links = rng.random((nodes, nodes)) < 0.03
    adjacency = (links | links.T).astype(np.float64) + np.eye(nodes)
    degree = 1 / np.sqrt(adjacency.sum(1))
    adjacency = (degree[:, None] * adjacency * degree[None, :]).astype(np.float32)
    features = rng.normal(size=(nodes, 12)).astype(np.float32)
    both = {s: {**WEIGHT, "Net_input_0": features, "Net_input_1": adjacency} for s in range(3)}
    run = write_run(tmp_path / "graph", both, collections={"model_inputs": ["Net_input_0", "Net_input_1"]})
    assert first_firing(evaluate_rule(run, "NotNormalizedData")) is None
    alone = {s: {**WEIGHT, "Net_input_1": adjacency} for s in range(3)}
    run = write_run(tmp_path / "alone", alone, collections={"model_inputs": ["Net_input_1"]})
    assert first_firing(evaluate_rule(run, "NotNormalizedData")) is not None


@pytest.mark.parametrize("scale", [1e4, 255.0])
def test_unscaled_features_are_still_reported_as_advice(tmp_path, scale):
    rng = np.random.default_rng(3)
    features = rng.normal(size=(64, 5)).astype(np.float32)
    features[:, 2] *= scale  # one feature in raw units
    run = write_run(tmp_path / "run", {s: {**WEIGHT, "Net_input_0": features} for s in range(3)},
                    collections={"model_inputs": ["Net_input_0"]})  # fmt: skip
    found = _findings(evaluate_rule(run, "NotNormalizedData"))
    assert found and found[0].details["channel"] == 2 and found[0].advice and not found[0].certain


# -- CheckInputImages: padded crops ----------------------------------------------------------------


def _images(rng, count=128, size=16, channels=3):
    return rng.random((count, channels, size, size))


def _padded_crops(rng, images, pad=2):
    count, channels, size, _ = images.shape
    padded = np.pad(images, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    crops = np.empty_like(images)
    for index in range(count):
        top, left = rng.integers(0, 2 * pad + 1, 2)
        crops[index] = padded[index, :, top : top + size, left : left + size]
    return crops


def test_without_constant_borders_matches_a_loop_oracle():
    rng = np.random.default_rng(4)
    images = _padded_crops(rng, _images(rng, count=20, size=10), pad=3)
    masked = without_constant_borders(images, 1)
    for index in range(images.shape[0]):
        for channel in range(3):
            image = images[index, channel]
            rows = [bool(np.all(row == row[0])) for row in image]
            columns = [bool(np.all(column == column[0])) for column in image.T]
            expected = np.zeros(image.shape, dtype=bool)
            for flags, axis in ((rows, 0), (columns, 1)):
                for order in (range(len(flags)), reversed(range(len(flags)))):
                    for position in order:
                        if not flags[position]:
                            break
                        if axis == 0:
                            expected[position, :] = True
                        else:
                            expected[:, position] = True
            assert np.array_equal(np.isnan(masked[index, channel]), expected)
    channels_last = without_constant_borders(np.moveaxis(images, 1, 3).copy(), 3)
    assert np.array_equal(np.isnan(channels_last), np.isnan(np.moveaxis(masked, 1, 3)))


def test_check_input_images_is_silent_on_crops_padded_before_normalisation_and_fires_when_off(tmp_path):
    """CIFAR's augmentation: zero padding, random crop, then Normalize with the data set's statistics:
    the padding shifts the channel means (oracle: beyond 0.2) but the images are normalised. The
    same crops normalised with the wrong mean (a shift of 0.5) still fire."""
    rng = np.random.default_rng(5)
    steps_ok, steps_off = {}, {}
    for step in range(5):
        images = _images(rng)
        mean, std = images.mean(axis=(0, 2, 3)), images.std(axis=(0, 2, 3))
        crops = _padded_crops(rng, images)
        normalised = (crops - mean[None, :, None, None]) / std[None, :, None, None]
        steps_ok[step] = {**WEIGHT, "Net_input_0": normalised.astype(np.float32)}
        steps_off[step] = {**WEIGHT, "Net_input_0": (normalised + 0.5).astype(np.float32)}
    oracle = np.concatenate([steps_ok[s]["Net_input_0"] for s in steps_ok]).mean(axis=(0, 2, 3))
    assert np.abs(oracle).max() > 0.2  # the whole-image mean alone would fire
    collections = {"model_inputs": ["Net_input_0"]}
    assert first_firing(evaluate_rule(write_run(tmp_path / "ok", steps_ok, collections=collections),
                                      "CheckInputImages")) is None  # fmt: skip
    off = _findings(evaluate_rule(write_run(tmp_path / "off", steps_off, collections=collections), "CheckInputImages"))
    assert off and off[0].advice


def test_check_input_images_judges_images_with_a_constant_background_on_their_whole_area(tmp_path):
    """MNIST-like digits, normalised with the data set's mean: their black margins are constant
    borders, and the whole-image mean (≈ 0) passes, as before; raw 0..255 ones fire."""
    rng = np.random.default_rng(6)
    digits = np.zeros((600, 1, 28, 28))
    digits[:, :, 8:20, 10:18] = rng.random((600, 1, 12, 8))
    normalised = (digits - digits.mean()) / digits.std()
    for name, images, fires in (("normalised", normalised, False), ("raw", digits * 255, True)):
        run = write_run(tmp_path / name, {0: {**WEIGHT, "Net_input_0": images.astype(np.float32)}},
                        collections={"model_inputs": ["Net_input_0"]})  # fmt: skip
        assert (first_firing(evaluate_rule(run, "CheckInputImages")) is not None) is fires, name


# -- targets over a vocabulary ---------------------------------------------------------------------


def test_vocabulary_targets_criteria():
    rng = np.random.default_rng(7)
    vocabulary = 300
    sequence_first = rng.integers(0, vocabulary, (21, 8))  # (T+1, B), as batchify() lays a corpus out
    tokens, targets = sequence_first[:-1], sequence_first[1:].reshape(-1)
    logits = np.zeros((targets.size, vocabulary), dtype=np.float32)
    assert vocabulary_targets(targets, logits, [tokens])  # next tokens, flattened, sequence first
    batch_first = rng.integers(0, vocabulary, (8, 21))
    assert vocabulary_targets(batch_first[:, 1:].reshape(-1), logits[: 8 * 20], [batch_first[:, :-1]])
    # shifted inside the model (Hugging Face): labels of B x (T-1) next to the B x T input ids
    assert vocabulary_targets(batch_first[:, 1:], logits[: 8 * 20], [batch_first])
    # a masked language model: one target per token (most ignored), scores over the vocabulary
    masked = np.where(rng.random(batch_first.shape) < 0.15, batch_first, -100)
    assert vocabulary_targets(masked.reshape(-1), np.zeros((masked.size, vocabulary)), [batch_first])
    # a tagger: one of 9 tags per token of a 300-word vocabulary: classes
    tags = rng.integers(0, 9, batch_first.shape)
    assert not vocabulary_targets(tags.reshape(-1), np.zeros((tags.size, 9)), [batch_first])
    # one label per sample of a token classifier: classes
    assert not vocabulary_targets(rng.integers(0, 4, 8), np.zeros((8, 4)), [batch_first])
    # no token ids seen: N x T targets with N x V x T scores over a vocabulary-sized class axis
    per_position = rng.integers(0, vocabulary, (8, 20))
    assert vocabulary_targets(per_position, np.zeros((8, vocabulary, 20)), [])
    # a segmentation's N x H x W masks over 3 classes: classes
    assert not vocabulary_targets(rng.integers(0, 3, (4, 8, 8)), np.zeros((4, 3, 8, 8)), [])
    # float regression targets are never token targets
    assert not vocabulary_targets(rng.normal(size=160), logits[:160], [tokens])


def _language_model_steps(rng, vocabulary=60, rare=16):
    """Next-token steps where one rare successor word is always mispredicted (the observed "class
    16 is mispredicted 97-100 % of the time")."""
    steps = {}
    for step in range(0, 400, 10):
        sequences = rng.integers(0, vocabulary, (16, 21))
        targets = sequences[:, 1:].reshape(-1)
        predicted = np.where(targets == rare, (rare + 1) % vocabulary, targets)
        logits = np.full((targets.size, vocabulary), -5.0, dtype=np.float32)
        logits[np.arange(targets.size), predicted] = 5.0
        steps[step] = {"CrossEntropyLoss_input_0": logits, "CrossEntropyLoss_input_1": targets,
                       "LM_input_0": sequences[:, :-1], "LM_emb.weight": np.ones((vocabulary, 2), dtype=np.float32)}
    return steps


def test_class_rules_do_not_judge_next_token_targets_and_say_so(tmp_path):
    rng = np.random.default_rng(8)
    steps = _language_model_steps(rng)
    run = write_run(tmp_path / "lm", steps, collections=LOSS_INPUTS)
    for rule in ("ClassImbalance", "Confusion"):
        results = evaluate_rule(run, rule)
        assert first_firing(results) is None, (rule, _findings(results)[:1])
        assert results[-1].not_evaluated and "per-token targets over a vocabulary" in results[-1].not_evaluated
    # the same labels with one model input per label (a classifier's samples) are classes: fires
    for tensors in steps.values():
        tensors["LM_input_0"] = rng.normal(size=(tensors["CrossEntropyLoss_input_1"].size, 3)).astype(np.float32)
    samples = write_run(tmp_path / "samples", steps, collections=LOSS_INPUTS)
    found = _findings(evaluate_rule(samples, "ClassImbalance"))
    assert any("class 16 is mispredicted" in result.message for result in found)


# -- ClassImbalance: one class only ----------------------------------------------------------------


def test_class_imbalance_reports_labels_that_are_all_one_class(tmp_path):
    rng = np.random.default_rng(9)
    steps = {}
    for step in range(0, 200, 10):
        labels, scores = np.zeros(64, dtype=np.int64), rng.normal(size=(64, 4)).astype(np.float32)
        steps[step] = {"CrossEntropyLoss_input_0": scores, "CrossEntropyLoss_input_1": labels}
    found = _findings(evaluate_rule(write_run(tmp_path / "run", steps, collections=LOSS_INPUTS), "ClassImbalance"))
    assert found and "every one of the" in found[0].message and found[0].advice
    assert found[0].details["imbalance_ratio"] == float("inf")


def test_class_imbalance_leaves_a_discriminators_constant_binary_targets_alone(tmp_path):
    """A GAN's discriminator: one score per sample, targets all 1 (real) or all 0 (generated) by
    design (the healthy GAN of test_healthy_families)."""
    rng = np.random.default_rng(10)
    steps = {s: {"BCELoss_input_0": rng.random(64).astype(np.float32), "BCELoss_input_1": np.ones(64, dtype=np.float32)}
             for s in range(0, 200, 10)}  # fmt: skip
    collections = {"predictions": ["BCELoss_input_0"], "labels": ["BCELoss_input_1"]}
    run = write_run(tmp_path / "run", steps, collections=collections)
    assert first_firing(evaluate_rule(run, "ClassImbalance")) is None


def test_class_imbalance_is_silent_on_a_regression_target_that_is_constant(tmp_path):
    """One value of a regression target repeated is no class: a scalar output per sample with
    non-binary targets has no class axis."""
    steps = {s: {"CrossEntropyLoss_input_0": np.linspace(0, 1, 64).astype(np.float32),
                 "CrossEntropyLoss_input_1": np.full(64, 3, dtype=np.int64)} for s in range(0, 200, 10)}  # fmt: skip
    results = evaluate_rule(write_run(tmp_path / "run", steps, collections=LOSS_INPUTS), "ClassImbalance")
    assert first_firing(results) is None


def test_class_imbalance_does_not_read_a_discriminators_real_and_fake_batches_as_classes(tmp_path):
    """A GAN's discriminator scores a batch of real samples (targets all 1) and one of generated
    samples (targets all 0) each step; the generator fooling it makes class 1 look "mispredicted
    100 %" (the detection corpus' healthy DCGAN). Batch-constant targets name a batch's source."""
    rng = np.random.default_rng(11)
    steps = {}
    for step in range(0, 400, 10):
        real, fake = rng.uniform(0.1, 0.4, 64), rng.uniform(0.1, 0.4, 64)  # fooled: real scored "fake"
        steps[step] = {
            "BCELoss_input_0": real.astype(np.float32), "BCELoss_input_1": np.ones(64, dtype=np.float32),
            "BCELoss_1_input_0": fake.astype(np.float32), "BCELoss_1_input_1": np.zeros(64, dtype=np.float32),
        }  # fmt: skip
    collections = {
        "predictions": ["BCELoss_input_0", "BCELoss_1_input_0"], "labels": ["BCELoss_input_1", "BCELoss_1_input_1"],
    }  # fmt: skip
    results = evaluate_rule(write_run(tmp_path / "gan", steps, collections=collections), "ClassImbalance")
    assert first_firing(results) is None, _findings(results)[:1]
    assert results[-1].not_evaluated and "each batch's source" in results[-1].not_evaluated
    # the same scores with each batch's labels mixed (a binary classifier) are judged: class 1 mispredicted
    for tensors in steps.values():
        mixed = np.r_[np.ones(32), np.zeros(32)].astype(np.float32)
        tensors["BCELoss_input_1"], tensors["BCELoss_1_input_1"] = mixed, mixed
        tensors["BCELoss_input_0"] = np.r_[rng.uniform(0.1, 0.4, 32), rng.uniform(0.1, 0.4, 32)].astype(np.float32)
    classifier = write_run(tmp_path / "classifier", steps, collections=collections)
    found = _findings(evaluate_rule(classifier, "ClassImbalance"))
    assert any("class 1 is mispredicted" in result.message for result in found), found[:1]


def test_unscaled_pixels_are_a_finding_from_the_first_batch_and_unit_range_ones_stay_advice(tmp_path):
    """Pixels fed as stored (0..255, channel mean ~127) are no preprocessing choice: reported at the
    first batch of 32 images as a finding, not advice. The same images scaled to [0, 1] (mean ~0.5)
    are judged only once threshold_samples images were seen, and then as advice."""
    rng = np.random.default_rng(8)
    unit = {step: rng.random((32, 3, 8, 8)) for step in range(20)}
    collections = {"model_inputs": ["Net_input_0"]}
    raw_steps = {s: {**WEIGHT, "Net_input_0": (255 * v).astype(np.float32)} for s, v in unit.items()}
    raw = write_run(tmp_path / "raw", raw_steps, collections=collections)
    found = _findings(evaluate_rule(raw, "CheckInputImages"))
    oracle = (255 * unit[0]).mean(axis=(0, 2, 3))
    assert oracle.min() > 100  # every channel far beyond any scaled pixels
    assert found and found[0].step == 0 and not found[0].advice, found[:1]
    assert "not preprocessed" in found[0].message
    scaled = write_run(tmp_path / "unit", {s: {**WEIGHT, "Net_input_0": v.astype(np.float32)} for s, v in unit.items()},
                       collections=collections)  # fmt: skip
    advised = _findings(evaluate_rule(scaled, "CheckInputImages"))
    assert advised and advised[0].advice and advised[0].step == 15  # 16 x 32 = 512 >= 500 images
