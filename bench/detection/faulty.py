"""Faulty runs across the fault taxonomy, written anew from public descriptions of the fault classes
(AutoTrainer's problem classes, TrainCheck's silent bugs, DeepFD/defects4ML fault types:
learning rate, optimizer, loss, activation, initialisation, data), plus planted faults.

Each case names the rules any one of which is a right primary diagnosis (what the fault *is*),
not the rules that happen to fire, and the step the fault starts acting. None comes from the
DeepLocalize Stack Overflow benchmark (kept out for judging)."""

from __future__ import annotations

from bench.detection.harness import Spec, train
from bench.detection.registry import FAULTY, Case

EXPLODING = ("ExplodingTensor", "WeightUpdateRatio")
NO_UPDATES = ("UnchangedTensor", "WeightUpdateRatio", "LossNotDecreasing")
VANISHING = ("VanishingGradient", "SaturatedActivation")
SATURATED = ("SaturatedActivation", "VanishingGradient", "PoorWeightInitialization")
BAD_INIT = ("PoorWeightInitialization", "AllZero")
NOT_LEARNING = ("LossNotDecreasing", "Underfitting")
# a Softmax before CrossEntropyLoss: the rule that names it, or the slow learning it causes
SOFTMAX_INTO_CE = ("ProbabilitiesIntoCrossEntropy", "VanishingGradient") + NOT_LEARNING
# inputs zeroed by a broken pipeline: the inputs' statistics (NotNormalizedData) or the first layer's zero gradients
ZERO_INPUTS = ("NotNormalizedData", "AllZero", "VanishingGradient", "LossNotDecreasing", "Underfitting")
# a negated loss is maximised: the loss module's own output (what the hook records) rises
NEGATED = ("LossNotDecreasing", "ExplodingTensor", "WeightUpdateRatio")
DEAD_INIT = ("DeadRelu", "PoorWeightInitialization")  # biases initialised at -20: an init fault that kills ReLUs


def _f(name: str, family: str, spec: Spec, expected: tuple[str, ...], symptom: str, description: str) -> Case:
    return Case(f"fault-{name}", family, FAULTY, train, spec, expected, spec.onset, symptom, description)


def faulty_cases() -> list[Case]:
    S = Spec
    images = {"task": "images", "model": "cnn"}
    sequences = {"task": "sequences"}
    return [
        # learning rate far too high (DeepFD/defects4ML "learning rate"; AutoTrainer exploding gradient)
        _f("lr-huge-mlp-sgd", "lr_high", S(lr=200.0), EXPLODING, "nonfinite", "SGD lr=200"),
        _f("lr-huge-cnn-sgd", "lr_high", S(**images, lr=1e4, seed=1), EXPLODING, "nonfinite", "CNN SGD lr=1e4"),
        _f("lr-huge-deep-mlp-sgd", "lr_high", S(model="deep_mlp", lr=50.0, seed=2, save_interval=2), EXPLODING,
           "nonfinite", "5 ReLU layers, SGD lr=50, save every 2"),  # fmt: skip
        _f("lr-huge-lstm-sgd", "lr_high", S(**sequences, model="lstm", lr=500.0, seed=3), EXPLODING + NOT_LEARNING,
           "no_learning", "LSTM SGD lr=500"),  # fmt: skip
        _f("lr-huge-mlp-adam", "lr_high", S(optimizer="adam", lr=10.0, seed=4), ("WeightUpdateRatio",) + NOT_LEARNING,
           "no_learning", "Adam lr=10"),  # fmt: skip
        _f("lr-huge-cnn-adam", "lr_high", S(**images, optimizer="adam", lr=10.0, save_interval=3),
           ("WeightUpdateRatio",) + NOT_LEARNING, "no_learning", "CNN Adam lr=10, save every 3"),  # fmt: skip
        _f("lr-huge-gru-rmsprop", "lr_high", S(**sequences, model="gru", optimizer="rmsprop", lr=5.0, seed=5),
           ("WeightUpdateRatio",) + NOT_LEARNING, "no_learning", "GRU RMSprop lr=5"),  # fmt: skip
        _f("lr-spike-mlp", "lr_high", S(lr=0.1, fault="lr_spike", onset=40, seed=6), EXPLODING, "nonfinite",
           "lr x1000 at step 40 (schedule bug)"),  # fmt: skip
        _f("lr-spike-cnn", "lr_high", S(**images, lr=0.1, fault="lr_spike", onset=30, seed=7, save_interval=2),
           EXPLODING, "no_learning", "CNN lr x1000 at step 30"),  # fmt: skip
        _f("dying-relu-lr-high", "lr_high", S(model="deep_mlp", lr=3.0, seed=8), EXPLODING + ("DeadRelu",),
           "no_learning", "5 ReLU layers, SGD lr=3: units die"),  # fmt: skip
        # learning rate zero or far too low (AutoTrainer slow convergence)
        _f("lr-zero-mlp", "no_updates", S(lr=0.0), NO_UPDATES, "frozen", "SGD lr=0"),
        _f("lr-zero-cnn-adam", "no_updates", S(**images, optimizer="adam", lr=0.0, seed=1, save_interval=2),
           NO_UPDATES, "frozen", "CNN Adam lr=0"),  # fmt: skip
        _f("lr-zero-lstm", "no_updates", S(**sequences, model="lstm", optimizer="adam", lr=0.0, seed=2), NO_UPDATES,
           "frozen", "LSTM Adam lr=0"),  # fmt: skip
        _f("lr-tiny-mlp-sgd", "slow", S(lr=1e-6, seed=3), NO_UPDATES, "no_learning", "SGD lr=1e-6"),
        _f("lr-tiny-cnn-sgd", "slow", S(**images, lr=1e-6, seed=4, save_interval=2), NO_UPDATES, "no_learning",
           "CNN SGD lr=1e-6"),  # fmt: skip
        _f("lr-tiny-gru-adam", "slow", S(**sequences, model="gru", optimizer="adam", lr=1e-7, seed=5), NO_UPDATES,
           "no_learning", "GRU Adam lr=1e-7"),  # fmt: skip
        _f("clip-to-zero", "slow", S(lr=0.1, clip=1e-7, seed=6), NO_UPDATES, "no_learning",
           "clip_grad_norm_ max_norm=1e-7"),  # fmt: skip
        # optimizer misuse (TrainCheck silent bugs)
        _f("no-optimizer-step-mlp", "optimizer", S(fault="no_optimizer_step"), NO_UPDATES, "frozen",
           "optimizer.step() never called"),  # fmt: skip
        _f("no-optimizer-step-gru", "optimizer", S(**sequences, model="gru", optimizer="adam", lr=0.01,
                                                   fault="no_optimizer_step", seed=1), NO_UPDATES, "frozen",
           "GRU, optimizer.step() missing"),  # fmt: skip
        _f("zero-grad-after-backward-mlp", "optimizer", S(optimizer="adam", lr=0.003, fault="zero_grad_after_backward",
                                                          seed=2), NO_UPDATES, "frozen",
           "zero_grad() between backward() and step()"),  # fmt: skip
        _f("zero-grad-after-backward-cnn", "optimizer", S(**images, lr=0.1, fault="zero_grad_after_backward", seed=3,
                                                          save_interval=2), NO_UPDATES, "frozen",
           "CNN, zero_grad() between backward() and step()"),  # fmt: skip
        _f("optimizer-misses-layers-mlp", "optimizer", S(lr=0.1, fault="optimizer_misses_layers", seed=4),
           ("UnchangedTensor", "WeightUpdateRatio"), "frozen", "optimizer given only the head's parameters"),
        _f("optimizer-misses-layers-cnn", "optimizer", S(**images, optimizer="adam", lr=0.003,
                                                         fault="optimizer_misses_layers", seed=5),
           ("UnchangedTensor", "WeightUpdateRatio"), "frozen", "CNN, optimizer given only the head"),  # fmt: skip
        _f("no-zero-grad-mlp", "optimizer", S(lr=0.1, fault="no_zero_grad", seed=6), EXPLODING + NOT_LEARNING,
           "no_learning", "optimizer.zero_grad() missing: gradients pile up"),  # fmt: skip
        _f("no-zero-grad-cnn-sgdm", "optimizer", S(**images, optimizer="sgd_momentum", lr=0.05, fault="no_zero_grad",
                                                   seed=7), EXPLODING + NOT_LEARNING, "no_learning",
           "CNN SGD momentum, zero_grad() missing"),  # fmt: skip
        _f("momentum-oscillation", "optimizer", S(optimizer="sgd_momentum_high", lr=1.0, seed=8),
           ("WeightUpdateRatio", "ExplodingTensor") + NOT_LEARNING, "no_learning",
           "SGD momentum 0.99 at lr 1 (AutoTrainer oscillating loss)"),  # fmt: skip
        _f("huge-weight-decay", "optimizer", S(lr=0.1, weight_decay=5.0, seed=9),
           ("AllZero", "VanishingGradient", "WeightUpdateRatio") + NOT_LEARNING, "no_learning",
           "SGD weight_decay=5: weights collapse"),  # fmt: skip
        # wrong loss for the task / output activation (DeepFD "loss", defects4ML)
        _f("softmax-before-ce-mlp", "loss", S(lr=0.1, fault="softmax_before_ce"), SOFTMAX_INTO_CE,
           "no_learning", "softmax output into CrossEntropyLoss"),  # fmt: skip
        _f("softmax-before-ce-deep", "loss", S(model="deep_mlp", lr=0.05, fault="softmax_before_ce", seed=1),
           SOFTMAX_INTO_CE, "no_learning", "5 ReLU layers, softmax into CE"),  # fmt: skip
        _f("softmax-before-ce-cnn", "loss", S(**images, lr=0.05, fault="softmax_before_ce", seed=2),
           SOFTMAX_INTO_CE, "no_learning", "CNN, softmax into CE"),  # fmt: skip
        _f("mse-on-class-index", "loss", S(loss="mse", lr=0.01, seed=3), NOT_LEARNING + ("Confusion",),
           "chance_accuracy",
           "MSE between one output and the class index"),  # fmt: skip
        _f("loss-sign-flipped", "loss", S(lr=0.05, fault="loss_sign_flipped", seed=4),
           NEGATED, "diverges", "loss negated: it falls without bound"),
        _f("loss-sign-flipped-adam", "loss", S(optimizer="adam", lr=0.01, fault="loss_sign_flipped", seed=5),
           NEGATED, "diverges", "Adam, loss negated"),
        _f("manual-log-of-zero", "loss", S(optimizer="adam", lr=0.01, fault="manual_log_zero", seed=6),
           ("ExplodingTensor",), "nonfinite", "-log(softmax(200*z)) by hand: log(0) = -inf"),  # fmt: skip
        # (a ReLU after the classifier layer was tried: with default init the run still learns, so it is
        # not a fault here and is not in the corpus)
        # vanishing gradients / saturation (AutoTrainer)
        _f("deep-sigmoid-10", "vanishing", S(model="deep_sigmoid", depth=10, lr=0.1), VANISHING, "no_learning",
           "10 sigmoid layers"),  # fmt: skip
        _f("deep-sigmoid-12-s1", "vanishing", S(model="deep_sigmoid", depth=12, lr=0.1, seed=1, save_interval=3),
           VANISHING, "no_learning", "12 sigmoid layers, save every 3"),  # fmt: skip
        _f("deep-sigmoid-8-adam", "vanishing", S(model="deep_sigmoid", depth=8, optimizer="adam", lr=1e-4, seed=2),
           VANISHING, "no_learning", "8 sigmoid layers, small Adam lr"),  # fmt: skip
        _f("deep-mlp-tiny-init", "vanishing", S(model="deep_mlp", init="tiny", lr=0.1, seed=3),
           VANISHING + BAD_INIT, "no_learning", "5 ReLU layers, weights N(0,1e-4)"),  # fmt: skip
        _f("deep-tanh-huge-init", "saturation", S(model="deep_tanh", init="huge"), SATURATED, "no_learning",
           "7 tanh layers, N(0,100)"),  # fmt: skip
        _f("deep-tanh-huge-init-s2", "saturation", S(model="deep_tanh", init="huge", seed=2, save_interval=2),
           SATURATED, "no_learning", "7 tanh layers, N(0,100), save every 2"),  # fmt: skip
        _f("deep-sigmoid-huge-init", "saturation", S(model="deep_sigmoid", init="huge", seed=3), SATURATED,
           "no_learning", "7 sigmoid layers, N(0,100)"),  # fmt: skip
        _f("deep-sigmoid-large-bias", "saturation", S(model="deep_sigmoid", init="large_bias", seed=1), SATURATED,
           "no_learning", "7 sigmoid layers, biases N(0,50)"),  # fmt: skip
        _f("deep-tanh-large-bias", "saturation", S(model="deep_tanh", init="large_bias", seed=2), SATURATED,
           "no_learning", "7 tanh layers, biases N(0,50)"),  # fmt: skip
        # initialisation
        _f("zero-init-mlp", "init", S(init="zero"), BAD_INIT, "no_learning", "all weights and biases 0"),
        _f("zero-init-cnn", "init", S(**images, init="zero", seed=1), BAD_INIT, "no_learning", "CNN all zeros"),
        _f("zero-init-deep", "init", S(model="deep_mlp", init="zero", optimizer="adam", lr=0.003, seed=2), BAD_INIT,
           "no_learning", "5 ReLU layers all zeros, Adam"),  # fmt: skip
        _f("constant-init-mlp", "init", S(init="constant", seed=3), BAD_INIT, "by_construction",
           "all weights 0.05: every unit of a layer stays identical"),
        _f("constant-init-deep", "init", S(model="deep_mlp", init="constant", seed=4, save_interval=2), BAD_INIT,
           "no_learning", "5 layers, all weights 0.05"),  # fmt: skip
        # dying ReLU
        _f("negative-bias-mlp", "dead_relu", S(init="negative_bias"), DEAD_INIT, "no_learning",
           "ReLU biases -20"),  # fmt: skip
        _f("negative-bias-cnn", "dead_relu", S(**images, init="negative_bias", seed=1, save_interval=2), DEAD_INIT,
           "no_learning", "CNN ReLU biases -20"),  # fmt: skip
        _f("negative-bias-deep-adam", "dead_relu", S(model="deep_mlp", init="negative_bias", optimizer="adam",
                                                     lr=0.001, seed=2), DEAD_INIT, "no_learning",
           "5 ReLU layers, biases -20, Adam"),  # fmt: skip
        # exploding recurrent gradients
        _f("relu-rnn-large-recurrent-init", "exploding", S(**sequences, model="rnn_relu", init="large_recurrent",
                                                           lr=0.1), EXPLODING + NOT_LEARNING, "no_learning",
           "ReLU RNN, recurrent weights N(0,3): activations grow 10 time steps"),  # fmt: skip
        _f("relu-rnn-large-recurrent-init-s1", "exploding", S(**sequences, model="rnn_relu", init="large_recurrent",
                                                              optimizer="adam", lr=0.01, seed=1),
           EXPLODING + NOT_LEARNING, "no_learning", "ReLU RNN, recurrent weights N(0,3), Adam"),  # fmt: skip
        _f("unscaled-regression-targets", "exploding", S(task="regression", lr=0.05, data_fault="unscaled_targets"),
           EXPLODING + ("NotNormalizedData",), "nonfinite", "targets y*1000+5000, SGD"),  # fmt: skip
        # non-finite data
        _f("nan-input-mlp", "nonfinite", S(lr=0.1, data_fault="nan_inputs", onset=30), ("ExplodingTensor",),
           "nonfinite", "a NaN feature from step 30"),  # fmt: skip
        _f("nan-input-cnn", "nonfinite", S(**images, optimizer="adam", lr=0.003, data_fault="nan_inputs", onset=20,
                                           seed=1, save_interval=2), ("ExplodingTensor",), "nonfinite",
           "CNN, a NaN pixel from step 20"),  # fmt: skip
        _f("nan-input-lstm", "nonfinite", S(**sequences, model="lstm", optimizer="adam", lr=0.01,
                                            data_fault="nan_inputs", onset=45, seed=2), ("ExplodingTensor",),
           "nonfinite", "LSTM, a NaN from step 45"),  # fmt: skip
        # data faults (defects4ML "missing normalisation", TrainCheck data pipeline bugs)
        _f("unnormalized-mlp-sgd", "data", S(data_fault="offset_scaled", lr=0.01), ("NotNormalizedData",),
           "by_construction", "features x*100+50"),  # fmt: skip
        _f("unnormalized-mlp-adam", "data", S(data_fault="offset_scaled", optimizer="adam", lr=0.003, seed=1),
           ("NotNormalizedData",), "by_construction", "features x*100+50, Adam"),  # fmt: skip
        # (images scaled to [0, 1] without mean subtraction, ToTensor only, are standard
        # preprocessing, not a fault (issue 43 item 2): healthy-unit-images-cnn, with Adam. With
        # SGD lr 0.1, as this case had, the CNN did not learn in 80 steps: loss 1.388 -> 1.377)
        _f("raw-images-cnn", "data", S(**images, data_fault="raw_images", seed=2),
           ("CheckInputImages", "NotNormalizedData"), "by_construction", "pixel values 0..255"),  # fmt: skip
        _f("raw-images-cnn-adam", "data", S(**images, data_fault="raw_images", optimizer="adam", lr=0.001, seed=3,
                                            save_interval=2), ("CheckInputImages", "NotNormalizedData"),
           "by_construction", "pixel values 0..255, Adam"),  # fmt: skip
        _f("zero-inputs-mlp", "data", S(data_fault="zero_inputs", lr=0.1, seed=4),
           ZERO_INPUTS, "no_learning", "inputs all zero (broken normalisation)"),
        _f("zero-inputs-midrun", "data", S(data_fault="zero_inputs", optimizer="adam", lr=0.003, onset=40, seed=5,
                                           steps=120), ZERO_INPUTS,
           "by_construction", "inputs all zero from step 40"),  # fmt: skip
        _f("shuffled-labels-mlp", "labels", S(data_fault="shuffled_labels", steps=140, save_interval=2),
           NOT_LEARNING + ("Confusion",), "no_learning", "labels unrelated to inputs"),  # fmt: skip
        _f("shuffled-labels-cnn-val", "labels", S(**images, data_fault="shuffled_labels", optimizer="adam", lr=0.003,
                                                  steps=140, seed=1, validation=True, eval_every=5, save_interval=2),
           NOT_LEARNING + ("Confusion", "Overfit"), "no_learning", "CNN, random labels, validation"),  # fmt: skip
        _f("shuffled-labels-lstm", "labels", S(**sequences, model="lstm", optimizer="adam", lr=0.01,
                                               data_fault="shuffled_labels", steps=140, seed=2),
           NOT_LEARNING + ("Confusion",), "no_learning", "LSTM, random labels"),  # fmt: skip
        _f("class-imbalance-mlp", "labels", S(data_fault="imbalanced", steps=60), ("ClassImbalance",),
           "by_construction", "95/5 labels"),  # fmt: skip
        _f("class-imbalance-cnn", "labels", S(**images, data_fault="imbalanced", seed=1, steps=60),
           ("ClassImbalance",), "by_construction", "CNN, 95/5 labels"),  # fmt: skip
        _f("padded-tokens", "labels", S(task="tokens", model="embedding", optimizer="adam", lr=0.01,
                                        data_fault="padded_tokens"), ("NLPSequenceRatio",), "by_construction",
           "~80 % padding"),  # fmt: skip
        _f("padded-tokens-bert", "labels", S(task="tokens", model="transformer", optimizer="adamw", lr=0.003,
                                             data_fault="padded_tokens", seed=1, save_interval=3),
           ("NLPSequenceRatio",), "by_construction", "BERT-style, ~80 % padding"),  # fmt: skip
        # overfitting (tiny training set, validation)
        _f("overfit-tiny-train", "overfit", S(model="wide_mlp", optimizer="adam", lr=0.01, train_size=16,
                                              validation=True, eval_every=5, steps=100), ("Overfit", "Overtraining"),
           "overfit", "16 training examples, wide MLP"),  # fmt: skip
        _f("overfit-tiny-train-s1", "overfit", S(model="wide_mlp", optimizer="adam", lr=0.01, train_size=16,
                                                 validation=True, eval_every=5, steps=100, seed=1),
           ("Overfit", "Overtraining"), "overfit", "16 training examples"),  # fmt: skip
        _f("overfit-cnn-small-set", "overfit", S(**images, optimizer="adam", lr=0.01, train_size=16, validation=True,
                                                 eval_every=5, steps=120, seed=2), ("Overfit", "Overtraining"),
           "overfit", "CNN, 16 training images"),  # fmt: skip
    ]
