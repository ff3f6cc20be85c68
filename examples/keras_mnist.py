"""A Keras 3 CNN on synthetic 28x28 digits, captured with trainguard's Keras hook.

    KERAS_BACKEND=torch python examples/keras_mnist.py --out trainguard-runs/keras-mnist
    KERAS_BACKEND=jax   python examples/keras_mnist.py --out trainguard-runs/keras-mnist-jax

The hook is a Keras callback: weights, biases, gradients, losses, metrics and layer outputs are
saved every ``--save-interval`` batches of ``fit`` (TRAIN), of its validation (EVAL) and of
``predict`` (PREDICT). At the end the script reads the run back and prints what it holds.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import trainguard.keras as tg  # noqa: E402
from trainguard.trial import create_trial  # noqa: E402


def synthetic_digits(count: int, templates: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Learnable synthetic data: each class is a fixed random template plus noise."""
    labels = rng.integers(0, 10, size=count)
    images = templates[labels] + 0.8 * rng.normal(size=(count, 28, 28, 1))
    return images.astype("float32"), labels


def build_model() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu", name="conv1"),
            keras.layers.MaxPooling2D(2, name="pool1"),
            keras.layers.Conv2D(32, 3, activation="relu", name="conv2"),
            keras.layers.MaxPooling2D(2, name="pool2"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(64, activation="relu", name="fc1"),
            keras.layers.Dense(10, name="fc2"),
        ],
        name="cnn",
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="trainguard-runs/keras-mnist")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--save-interval", type=int, default=10)
    args = parser.parse_args()

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    templates = rng.normal(size=(10, 28, 28, 1))
    train_x, train_y = synthetic_digits(2048, templates, rng)
    val_x, val_y = synthetic_digits(512, templates, rng)

    model = build_model()
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    hook = tg.KerasHook(
        out_dir=args.out,
        save_config=tg.SaveConfig(save_interval=args.save_interval),
        include_collections=["weights", "biases", "gradients", "losses", "metrics", "outputs", "relu_input",
                             "relu_output", "tanh_input", "sigmoid_input", "model_inputs"],
    )
    with hook:
        model.fit(
            train_x,
            train_y,
            batch_size=args.batch_size,
            epochs=args.epochs,
            validation_data=(val_x, val_y),
            callbacks=[hook],
            verbose=2,
        )
        model.predict(val_x[:128], batch_size=args.batch_size, callbacks=[hook], verbose=0)

    trial = create_trial(args.out)
    print(f"backend {keras.backend.backend()}: captured run at {args.out}")
    for mode in (tg.modes.TRAIN, tg.modes.EVAL, tg.modes.PREDICT):
        print(f"  {mode.name:<8} steps {trial.steps(mode=mode)}")
    for collection in ("weights", "biases", "gradients", "losses", "metrics", "outputs"):
        print(f"  {collection:<9} {', '.join(sorted(trial.tensor_names(collection=collection)))}")
    losses = trial.tensor("loss").values(mode=tg.modes.TRAIN)
    print("  loss     ", ", ".join(f"{step}: {float(value):.3f}" for step, value in losses.items()))
    gradient = trial.tensor("gradients/conv1/kernel")
    last = gradient.steps()[-1]
    print(f"  |gradients/conv1/kernel| at global step {last}: {np.linalg.norm(gradient.value(last)):.4f}")


if __name__ == "__main__":
    main()
