"""Healthy runs: the settings users actually train in (noise, batch size 1, no validation, bf16,
accumulation, compile, frozen backbones, fine-tuning, schedules, converged tiny problems, ...).
None of them may be flagged by any rule."""

from __future__ import annotations

from bench.detection.harness import Spec, train
from bench.detection.registry import HEALTHY, Case


def _h(name: str, family: str, spec: Spec, description: str, symptom: str = "learns") -> Case:
    return Case(f"healthy-{name}", family, HEALTHY, train, spec, (), 0, symptom, description)


def healthy_cases() -> list[Case]:
    S = Spec
    cases = []
    # plain classifiers, every optimizer, with and without a validation loop
    for seed, (optimizer, lr) in enumerate(
        [("sgd", 0.1), ("sgd_momentum", 0.05), ("adam", 0.003), ("adamw", 0.003), ("rmsprop", 0.002), ("adam", 0.001)]
    ):
        validation = seed % 2 == 0
        interval = (1, 2, 5)[seed % 3]
        cases.append(
            _h(
                f"mlp-{optimizer}-{'val' if validation else 'noval'}-s{seed}",
                "mlp",
                S(optimizer=optimizer, lr=lr, seed=seed, validation=validation, save_interval=interval,
                  steps=100 if interval == 5 else 80),
                f"2-layer ReLU MLP, {optimizer} lr={lr}, save every {interval}",
            )
        )  # fmt: skip
    cases += [
        _h("deep-mlp-sgdm", "mlp", S(model="deep_mlp", optimizer="sgd_momentum", lr=0.05, batch=64), "5 ReLU layers"),
        _h("deep-mlp-adam-val", "mlp", S(model="deep_mlp", optimizer="adam", lr=0.001, seed=1, validation=True,
                                         save_interval=2), "5 ReLU layers, validation"),  # fmt: skip
        _h("wide-mlp-adam", "mlp", S(model="wide_mlp", optimizer="adam", lr=0.001, seed=2), "256-wide MLP"),
        _h("mlp-tanh-sgd", "mlp", S(model="mlp_tanh", lr=0.1, seed=3), "tanh MLP"),
        _h("mlp-tanh-adam-val", "mlp", S(model="mlp_tanh", optimizer="adam", lr=0.003, seed=4, validation=True),
           "tanh MLP, validation"),  # fmt: skip
        _h("mlp-gelu-adamw", "mlp", S(model="mlp_gelu", optimizer="adamw", lr=0.003, seed=5), "GELU MLP"),
        _h("mlp-functional-relu", "mlp", S(model="functional_mlp", optimizer="adam", lr=0.003, seed=6),
           "F.relu in forward (no ReLU modules)"),  # fmt: skip
        _h("mlp-functional-relu-sgd", "mlp", S(model="functional_mlp", lr=0.1, seed=7, save_interval=2),
           "F.relu in forward, SGD"),  # fmt: skip
        _h("linear-logreg", "mlp", S(model="linear", lr=0.1, seed=8), "logistic regression"),
        _h("binary-bce-adam-val", "mlp", S(loss="bce", classes=2, optimizer="adam", lr=0.003, validation=True),
           "one logit, BCEWithLogitsLoss"),  # fmt: skip
        _h("binary-bce-sgd", "mlp", S(loss="bce", classes=2, lr=0.1, seed=1, save_interval=2), "one logit, SGD"),
        _h("mlp-dropout-adam", "regularised", S(model="mlp_dropout", optimizer="adam", lr=0.003, seed=2),
           "dropout 0.3"),  # fmt: skip
        _h("mlp-dropout-val", "regularised", S(model="mlp_dropout", lr=0.1, seed=3, validation=True), "dropout, val"),
        _h("mlp-weight-decay", "regularised", S(optimizer="adamw", lr=0.003, weight_decay=0.1, seed=4),
           "AdamW weight decay 0.1"),  # fmt: skip
        _h("mlp-clipped", "regularised", S(lr=0.2, clip=1.0, seed=5), "clip_grad_norm_ 1.0"),
    ]
    # images
    cases += [
        _h("cnn-sgd-noval", "cnn", S(task="images", model="cnn", lr=0.1), "2-conv CNN, SGD"),
        _h("cnn-sgd-val-s1", "cnn", S(task="images", model="cnn", lr=0.1, seed=1, validation=True, save_interval=2),
           "CNN, validation"),  # fmt: skip
        _h("cnn-adam-noval", "cnn", S(task="images", model="cnn", optimizer="adam", lr=0.003, seed=2), "CNN, Adam"),
        _h("cnn-adam-val-s3", "cnn", S(task="images", model="cnn", optimizer="adam", lr=0.001, seed=3,
                                       validation=True, save_interval=5, steps=100), "CNN, save every 5"),  # fmt: skip
        _h("cnn-bn-sgdm", "cnn", S(task="images", model="cnn_bn", optimizer="sgd_momentum", lr=0.05), "CNN+BatchNorm"),
        _h("cnn-bn-adam", "cnn", S(task="images", model="cnn_bn", optimizer="adam", lr=0.003, seed=1), "CNN+BN Adam"),
        _h("unit-images-cnn", "cnn", S(task="images", model="cnn", data_fault="unit_images", optimizer="adam",
                                       lr=0.003, seed=1), "CNN, images in [0,1] (ToTensor only, no mean subtraction)"),  # fmt: skip
    ]
    # sequences
    cases += [
        _h("lstm-adam", "recurrent", S(task="sequences", model="lstm", optimizer="adam", lr=0.01), "LSTM"),
        _h("lstm-adam-val-s1", "recurrent", S(task="sequences", model="lstm", optimizer="adam", lr=0.01, seed=1,
                                              validation=True, save_interval=2), "LSTM, validation"),  # fmt: skip
        _h("lstm-sgd-clip", "recurrent", S(task="sequences", model="lstm", optimizer="sgd_momentum", lr=0.1, clip=1.0,
                                           seed=2), "LSTM, SGD momentum, clipping"),  # fmt: skip
        _h("gru-adam", "recurrent", S(task="sequences", model="gru", optimizer="adam", lr=0.01, seed=3), "GRU"),
        _h("gru-rmsprop", "recurrent", S(task="sequences", model="gru", optimizer="rmsprop", lr=0.003, seed=4), "GRU"),
        _h("rnn-tanh-adam", "recurrent", S(task="sequences", model="rnn", optimizer="adam", lr=0.005, seed=5),
           "Elman RNN"),  # fmt: skip
    ]
    # attention and embeddings (key-bias gradient is exactly zero; unused embedding rows)
    cases += [
        _h("tinybert-adamw-warmup", "attention", S(task="tokens", model="transformer", optimizer="adamw", lr=0.003,
                                                   schedule="warmup_cosine"),
           "BERT-style layer, key bias"),  # fmt: skip
        _h("tinybert-adam-unused-vocab", "attention", S(task="tokens", model="transformer", optimizer="adam",
                                                        lr=0.002, seed=1, unused_vocab=200),
           "200 unused rows"),  # fmt: skip
        _h("tinybert-adamw-val", "attention", S(task="tokens", model="transformer", optimizer="adamw", lr=0.002,
                                                seed=2, validation=True, save_interval=2), "validation"),  # fmt: skip
        _h("tinybert-bs1", "attention", S(task="tokens", model="transformer", optimizer="adamw", lr=0.001, seed=3,
                                          batch=1, steps=120), "batch size 1"),  # fmt: skip
        _h("embedding-bag-unused-rows", "attention", S(task="tokens", model="embedding", optimizer="adam", lr=0.01,
                                                       unused_vocab=500), "500 embedding rows never used"),  # fmt: skip
        _h("embedding-bag-sgd", "attention", S(task="tokens", model="embedding", lr=0.5, seed=1), "embedding, SGD"),
    ]
    # batch size 1 and very noisy mini-batches, no validation
    cases += [
        _h("mlp-bs1-sgd", "noisy", S(batch=1, lr=0.01, steps=200, save_interval=2), "batch size 1"),
        _h("mlp-bs1-zero-rows", "noisy", S(batch=1, lr=0.01, steps=400, save_interval=4, zero_rows=0.3, seed=1),
           "batch size 1, 30 % of inputs all zero"),  # fmt: skip
        _h("mlp-bs1-adam", "noisy", S(batch=1, optimizer="adam", lr=0.001, steps=200, seed=2), "batch size 1, Adam"),
        _h("cnn-bs2", "noisy", S(task="images", model="cnn", batch=2, lr=0.02, steps=300, save_interval=3, seed=3),
           "batch size 2"),  # fmt: skip
        _h("mlp-label-noise-30", "noisy", S(batch=8, label_noise=0.3, lr=0.05, steps=150, seed=4),
           "batch 8, 30 % random labels"),  # fmt: skip
        _h("mlp-hard-task", "noisy", S(batch=16, separation=0.4, noise=1.5, optimizer="adam", lr=0.003, steps=150,
                                       seed=5), "classes overlap, batch 16"),  # fmt: skip
        _h("mlp-sparse-inputs", "noisy", S(zero_rows=0.5, optimizer="adam", lr=0.003, seed=6), "half the rows zero"),
    ]
    # mixed precision, accumulation, compile
    cases += [
        _h("mlp-bf16", "precision", S(bf16=True, optimizer="adam", lr=0.003), "bf16 autocast"),
        _h("cnn-bf16", "precision", S(task="images", model="cnn", bf16=True, lr=0.1, seed=1), "CNN bf16 autocast"),
        _h("tinybert-bf16", "precision", S(task="tokens", model="transformer", bf16=True, optimizer="adamw",
                                           lr=0.003, seed=2), "bf16 attention"),  # fmt: skip
        _h("mlp-accum4", "accumulation", S(accumulation=4, batch=8, lr=0.1, seed=3), "4 micro-batches per step"),
        _h("cnn-accum2-adam", "accumulation", S(task="images", model="cnn", accumulation=2, batch=16,
                                                optimizer="adam", lr=0.003, seed=4), "2 micro-batches"),  # fmt: skip
        _h("lstm-accum3", "accumulation", S(task="sequences", model="lstm", accumulation=3, batch=8,
                                            optimizer="adam", lr=0.01, seed=5), "LSTM, 3 micro-batches"),  # fmt: skip
        _h("mlp-compiled", "compile", S(compile=True, optimizer="adam", lr=0.003, steps=60), "torch.compile"),
        _h("cnn-compiled", "compile", S(task="images", model="cnn", compile=True, lr=0.1, steps=60, seed=1),
           "torch.compile CNN"),  # fmt: skip
    ]
    # frozen layers and fine-tuning
    cases += [
        _h("mlp-frozen-first", "finetune", S(freeze="first", optimizer="adam", lr=0.003), "frozen first layer"),
        _h("cnn-frozen-first", "finetune", S(task="images", model="cnn", freeze="first", lr=0.1, seed=1),
           "frozen first conv"),  # fmt: skip
        _h("tinybert-frozen-embedding", "finetune", S(task="tokens", model="transformer", freeze="first",
                                                      optimizer="adamw", lr=0.003, seed=2),
           "frozen embedding"),  # fmt: skip
        _h("mlp-finetune-low-lr", "finetune", S(pretrain_steps=150, optimizer="adam", lr=1e-4, seed=3),
           "fine-tuning at lr 1e-4", "stable"),  # fmt: skip
        _h("cnn-finetune-low-lr", "finetune", S(task="images", model="cnn", pretrain_steps=150, lr=1e-3, seed=4,
                                                validation=True), "fine-tuning at lr 1e-3, val", "stable"),  # fmt: skip
        _h("lstm-finetune-frozen", "finetune", S(task="sequences", model="lstm", pretrain_steps=100, freeze="first",
                                                 optimizer="adam", lr=3e-4, seed=5), "frozen LSTM, head tuned",
           "stable"),  # fmt: skip
    ]
    # schedules
    cases += [
        _h("mlp-warmup-cosine", "schedule", S(schedule="warmup_cosine", optimizer="adamw", lr=0.005, steps=120),
           "warm-up + cosine"),  # fmt: skip
        _h("cnn-warmup-cosine", "schedule", S(task="images", model="cnn", schedule="warmup_cosine", lr=0.2,
                                              optimizer="sgd_momentum", seed=1), "SGD warm-up + cosine"),  # fmt: skip
        _h("mlp-step-lr", "schedule", S(schedule="step", lr=0.2, seed=2, steps=120), "StepLR"),
        _h("mlp-onecycle", "schedule", S(schedule="onecycle", optimizer="adam", lr=0.01, seed=3), "OneCycleLR"),
    ]
    # converged tiny problems and other tasks
    cases += [
        _h("xor-converged-adam", "converged", S(task="xor", model="mlp_tanh", width=8, optimizer="adam", lr=0.05,
                                                batch=4, steps=400, save_interval=4), "XOR to ~1e-3 loss"),  # fmt: skip
        _h("xor-converged-sgdm", "converged", S(task="xor", model="mlp_tanh", width=8, optimizer="sgd_momentum",
                                                lr=0.5, batch=4, steps=400, seed=1, save_interval=4),
           "XOR, SGDm"),  # fmt: skip
        _h("small-set-converged", "converged", S(train_size=64, optimizer="adam", lr=0.01, steps=200,
                                                 save_interval=2), "64 examples, many epochs"),  # fmt: skip
        _h("multilabel-bce-adam", "tasks", S(task="multilabel", optimizer="adam", lr=0.003), "5 labels, BCE"),
        _h("multilabel-bce-sgd-val", "tasks", S(task="multilabel", lr=1.0, seed=1, validation=True),
           "multi-label, validation"),  # fmt: skip
        _h("regression-mse-sgd", "tasks", S(task="regression", lr=0.05), "regression, MSE"),
        _h("regression-mse-adam-val", "tasks", S(task="regression", optimizer="adam", lr=0.003, seed=1,
                                                 validation=True, save_interval=2), "regression, val"),  # fmt: skip
        _h("regression-linear", "tasks", S(task="regression", model="linear", lr=0.05, seed=2), "linear regression"),
        _h("mlp-long-run", "tasks", S(optimizer="adam", lr=0.001, steps=300, save_interval=5, seed=9,
                                      validation=True, eval_every=25), "300 steps, save every 5"),  # fmt: skip
    ]
    return cases
