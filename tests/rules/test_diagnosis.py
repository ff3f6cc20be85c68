"""One diagnosis per run: ranking findings by the explanation graph and the step they came at."""

from __future__ import annotations

from trainguard.rules.diagnosis import CAUSAL_ORDER, EXPLAINS, NON_FINITE, diagnose, finding_kind, render_diagnosis


def _result(rule: str, *findings: tuple[int, str], worker: str = "worker_0", **extra) -> dict:
    return {
        "configuration_name": rule, "rule": rule, "status": "IssuesFound" if findings else "NoIssuesFound",
        "findings": [
            {"rule": rule, "step": step, "fired": True, "message": message, "fix_hint": f"fix {rule}",
             "certain": "nan" in message.lower(), "worker": worker}
            for step, message in findings
        ],
        **extra,
    }  # fmt: skip


def test_nan_explains_dead_relus_update_ratios_and_the_loss() -> None:
    results = [
        _result("DeadRelu", (20, "layer relu1: 100% of units inactive")),
        _result("ExplodingTensor", (20, "3 tensor(s) hold NaN/inf values")),
        _result("WeightUpdateRatio", (30, "update of fc1.weight is 1e6 times its norm")),
        _result("LossNotDecreasing", (10, "loss rose by 40% over the window")),
        _result("VanishingGradient"),
    ]
    diagnosis = diagnose(results)
    assert [(f["rule"], f["step"]) for f in diagnosis["primary"]] == [("ExplodingTensor", 20)]
    assert diagnosis["primary"][0]["fix_hint"] == "fix ExplodingTensor" and diagnosis["primary"][0]["certain"]
    consequences = {f["rule"]: f for f in diagnosis["consequences"]}
    # the loss finding came first (step 10) but is judged over windows: the NaN still explains it
    assert set(consequences) == {"DeadRelu", "WeightUpdateRatio", "LossNotDecreasing"}
    assert consequences["DeadRelu"]["explained_by"] == "ExplodingTensor" and "NaN" in consequences["DeadRelu"]["why"]
    assert diagnosis["other"] == [] and diagnosis["not_evaluated"] == []


def test_a_cause_must_come_first_for_tensor_symptoms() -> None:
    # dead ReLUs long before any NaN are not explained by it: they are the primary finding
    results = [
        _result("DeadRelu", (5, "layer relu1: 95% of units inactive")),
        _result("ExplodingTensor", (50, "gradient/fc1.weight holds NaN")),
    ]
    diagnosis = diagnose(results)
    # the NaN is the earliest certain finding, so it leads; the dead ReLUs before it are not its
    # consequence (a cause comes first), they are another problem
    assert [f["rule"] for f in diagnosis["primary"]] == ["ExplodingTensor"]
    assert [f["rule"] for f in diagnosis["consequences"]] == [] and [f["rule"] for f in diagnosis["other"]] == [
        "DeadRelu"
    ]
    # without a certain finding the earliest finding nothing explains leads
    results[1] = _result("ExplodingTensor", (50, "gradient/fc1.weight grew 1e6 times"))
    diagnosis = diagnose(results)
    assert [f["rule"] for f in diagnosis["primary"]] == ["DeadRelu"]
    assert [f["rule"] for f in diagnosis["other"]] == ["ExplodingTensor"]


def test_vanishing_gradients_explain_unchanged_tensors_and_poor_init_explains_both() -> None:
    results = [
        _result("UnchangedTensor", (40, "fc1.weight did not change")),
        _result("VanishingGradient", (30, "gradients vanished in 4 of 5 layers")),
    ]
    diagnosis = diagnose(results)
    assert [f["rule"] for f in diagnosis["primary"]] == ["VanishingGradient"]
    assert [f["rule"] for f in diagnosis["consequences"]] == ["UnchangedTensor"]
    results.append(_result("PoorWeightInitialization", (0, "weights of fc1 are 1000x too small")))
    diagnosis = diagnose(results)
    assert [f["rule"] for f in diagnosis["primary"]] == ["PoorWeightInitialization"]
    # UnchangedTensor is reached through VanishingGradient (and directly): listed once
    assert sorted(f["rule"] for f in diagnosis["consequences"]) == ["UnchangedTensor", "VanishingGradient"]


def test_the_same_rule_on_two_workers_is_one_entry_naming_both() -> None:
    results = [
        {**_result("ExplodingTensor", (3, "loss is -inf"), worker="worker_1")},
    ]
    results[0]["findings"].append({**results[0]["findings"][0], "step": 5, "worker": "worker_0"})
    diagnosis = diagnose(results)
    (primary,) = diagnosis["primary"]
    assert (primary["step"], primary["worker"], primary["workers"]) == (3, "worker_1", ["worker_0", "worker_1"])
    assert "on worker_0, worker_1" in "\n".join(render_diagnosis(diagnosis))


def test_rules_that_could_not_evaluate_are_listed_not_counted_as_clean() -> None:
    results = [
        _result("Overfit", status="Error", status_details="RuleNotEvaluated: no EVAL steps"),
        _result("DeadRelu", status="Error", status_details="ValueError: boom"),
    ]
    results[0]["status"] = results[1]["status"] = "Error"
    diagnosis = diagnose(results)
    assert diagnosis["primary"] == [] and diagnosis["not_evaluated"] == [
        {"rule": "Overfit", "configuration_name": "Overfit", "reason": "no EVAL steps", "not_applicable": False}
    ]
    results[0]["not_applicable"] = True  # the runner's word: it does not apply to the run by design
    assert diagnose(results)["not_evaluated"][0]["not_applicable"] is True
    assert "not evaluated: Overfit: no EVAL steps" in "\n".join(render_diagnosis(diagnosis))


def test_finding_kinds_and_the_graph_are_consistent() -> None:
    assert finding_kind({"rule": "DeadRelu", "message": "layer is NaN"}) == NON_FINITE
    assert finding_kind({"rule": "LossNotDecreasing", "message": "loss became -inf at step 3"}) == NON_FINITE
    assert finding_kind({"rule": "DeadRelu", "message": "95% of units inactive (information)"}) == "DeadRelu"
    for edge in EXPLAINS:
        assert edge.why and edge.cause != edge.effect
        assert edge.cause in CAUSAL_ORDER, edge


def test_saturated_activations_explain_all_zero_gradients_at_the_same_step() -> None:
    # a deep tanh net with a huge init: both rules fire at step 2; the saturation is the cause
    # (float32 rounds tanh's derivative to 0), the all-zero gradients are its consequence
    results = [
        _result("AllZero", (2, "4 tensor(s) are >= 100% zeros, e.g. gradient/fc1.bias")),
        _result("SaturatedActivation", (2, "78% of the nodes of tanh input 3_input_0 are saturated")),
        _result("VanishingGradient", (2, "6 of 16 gradient(s) vanished")),
    ]
    diagnosis = diagnose(results)
    assert [f["rule"] for f in diagnosis["primary"]] == ["SaturatedActivation"]
    assert {f["rule"] for f in diagnosis["consequences"]} == {"AllZero", "VanishingGradient"}
    # an all-zero tensor long before any saturation is not explained by it
    results[0] = _result("AllZero", (1, "4 tensor(s) are >= 100% zeros"))
    assert [f["rule"] for f in diagnose(results)["primary"]] == ["AllZero"]


def test_oversized_updates_explain_the_all_zero_gradients_that_follow() -> None:
    """REINFORCE at 1e4 times its learning rate (Adam lr 100), as the rules saw it: the updates are
    thousands of times the weights' norm from step 20 (never certain), and from step 30 the
    gradients behind the softmax pinned at 0 and 1 are all zeros (certain from step 50). The stop
    names the learning rate, not the zeros it caused."""
    results = [
        {"rule": "WeightUpdateRatio", "findings": [
            {"step": step, "message": "update of Policy_affine2.weight is 6312 times its norm", "certain": False}
            for step in (20, 30, 40)]},
        {"rule": "AllZero", "findings": [
            {"step": step, "message": "4 tensor(s) are >= 100% zeros, e.g. gradient/Policy_affine1.bias",
             "certain": step >= 50} for step in (30, 40, 50, 60)]},
        {"rule": "UnchangedTensor", "findings": [{"step": 200, "message": "4 tensor(s) did not change",
                                                  "certain": True}]},
    ]  # fmt: skip
    diagnosis = diagnose(results)
    assert [f["rule"] for f in diagnosis["primary"]] == ["WeightUpdateRatio"]
    consequences = {f["rule"]: f for f in diagnosis["consequences"]}
    assert set(consequences) == {"AllZero", "UnchangedTensor"}
    assert consequences["AllZero"]["explained_by"] == "WeightUpdateRatio"
    assert "all zeros" in consequences["AllZero"]["why"]
    # zeros seen before any oversized update are another problem, not its consequence
    results[1]["findings"][0]["step"] = 10
    assert [f["rule"] for f in diagnose(results)["primary"]] == ["AllZero"]


def test_a_mispredicted_class_is_a_symptom_of_a_model_that_does_not_learn() -> None:
    """ClassImbalance's misprediction finding (labels balanced, one class predicted wrong) does not
    explain a stalled loss: with shuffled labels the stalled loss is the primary finding."""
    results = [
        {"rule": "ClassImbalance", "findings": [{"step": 130, "message": "class 0 is mispredicted 92 % of the time "
                                                 "in the last 512 labels (threshold_misprediction 0.7)"}]},
        {"rule": "LossNotDecreasing", "findings": [{"step": 138, "message": "the loss did not learn"}]},
    ]  # fmt: skip
    diagnosis = diagnose(results)
    assert [f["rule"] for f in diagnosis["primary"]] == ["LossNotDecreasing"]
    assert [f["rule"] for f in diagnosis["consequences"]] == ["ClassImbalance"]
    # a real label imbalance still explains the stalled loss
    results[0]["findings"][0]["message"] = "class 0 has 24.6x as many labels as class 1 (492 vs 20)"
    assert [f["rule"] for f in diagnose(results)["primary"]] == ["ClassImbalance"]


def test_unscaled_images_explain_the_oversized_updates_they_cause() -> None:
    # raw 0..255 pixels (a finding, not advice, from the first batch) make the first layer's
    # gradient huge: the update ratio that follows is their consequence, not the primary
    results = [
        _result("WeightUpdateRatio", (3, "update of Net_conv1.weight is 9e4 times its norm")),
        _result("VanishingGradient", (5, "2 of 7 gradient(s) vanished")),
        _result("DeadRelu", (9, "100% of the ReLUs in 1_output_0 are dead")),
        _result("CheckInputImages", (0, "channel 0 has mean 127.4 (not preprocessed)")),
    ]
    diagnosis = diagnose(results)
    assert [f["rule"] for f in diagnosis["primary"]] == ["CheckInputImages"]
    consequences = {f["rule"]: f["explained_by"] for f in diagnosis["consequences"]}
    assert consequences == {"WeightUpdateRatio": "CheckInputImages", "VanishingGradient": "WeightUpdateRatio",
                            "DeadRelu": "CheckInputImages"}, consequences  # fmt: skip


def test_a_finding_confirmed_later_is_certain_from_that_step() -> None:
    # ReplicaDivergence: the first fingerprint that differs is not certain, the second one is
    results = [_result("ReplicaDivergence", (8, "1 parameter(s) differ between ranks"), (12, "still differ"))]
    results[0]["findings"][1]["certain"] = True
    (primary,) = diagnose(results)["primary"]
    assert (primary["step"], primary["certain"], primary["certain_from"]) == (8, True, 12)
    assert "(certain from step 12)" in render_diagnosis(diagnose(results))[0]
    # one never confirmed stays uncertain, and says so
    results[0]["findings"][1]["certain"] = False
    (primary,) = diagnose(results)["primary"]
    assert not primary["certain"] and "certain_from" not in primary
    assert "(not certain)" in render_diagnosis(diagnose(results))[0]
