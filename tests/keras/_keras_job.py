"""A small Keras training job run by the tests in a subprocess, one per backend.

Usage: ``KERAS_BACKEND=torch|jax python _keras_job.py SCENARIO OUT_DIR RECORD.npz``.

Keras chooses its backend once, at import, so each backend needs its own process. The job
records what Keras itself reports (weights at each batch begin, batch logs, predictions) into
``RECORD.npz`` for the test to compare with what the hook wrote.

Scenarios:
    full      fit (with validation data) + evaluate + predict, hook saving every 2nd step
    subclassed  a subclassed model with a nested custom layer (JAX: also run eagerly)
    failopen  the same fit from the same seed without a hook, with a hook whose gradient and
              output capture raises, and (JAX) with a capture step that raises; records the
              final weights and loss history of each run
"""

from __future__ import annotations

import sys

import keras
import numpy as np

import trainguard.keras as tg

BATCH = 4
X = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
Y = np.random.default_rng(1).normal(size=(16, 2)).astype("float32")
X_VAL, Y_VAL = X[:8] + 0.5, Y[:8]


def build_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(5, activation="relu", name="hidden"),
            keras.layers.Dense(2, name="head"),
        ],
        name="net",
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
    return model


class Recorder(keras.callbacks.Callback):
    """What Keras reports, batch by batch, in the order the hook sees the batches."""

    def __init__(self) -> None:
        super().__init__()
        self.weights: list[list[np.ndarray]] = []  # at each TRAIN batch begin
        self.logs: list[tuple[str, dict[str, float]]] = []  # (mode, logs) of every batch

    hook = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.hook is not None:
            self.hook.save_scalar("epoch", epoch)

    def on_train_batch_begin(self, batch, logs=None):
        self.weights.append([np.array(keras.ops.convert_to_numpy(w)) for w in self.model.weights])

    def on_train_batch_end(self, batch, logs=None):
        self.logs.append(("TRAIN", dict(logs)))

    def on_test_batch_end(self, batch, logs=None):
        self.logs.append(("EVAL", dict(logs)))

    def on_predict_batch_end(self, batch, logs=None):
        self.logs.append(("PREDICT", {}))


def full(out_dir: str, record: str) -> None:
    model = build_model()
    recorder = Recorder()
    hook = tg.KerasHook(
        out_dir,
        save_config=tg.SaveConfig(save_interval=2),
        include_collections=["weights", "biases", "gradients", "losses", "metrics", "outputs"],
        reduction_config=tg.ReductionConfig(norms=["l2"], save_raw_tensor=True),
    )
    recorder.hook = hook
    model.fit(
        X,
        Y,
        batch_size=BATCH,
        epochs=2,
        shuffle=False,
        verbose=0,
        validation_data=(X_VAL, Y_VAL),
        callbacks=[recorder, hook],
    )
    model.evaluate(X_VAL, Y_VAL, batch_size=BATCH, verbose=0, callbacks=[recorder, hook])
    predictions = model.predict(X, batch_size=8, verbose=0, callbacks=[recorder, hook])
    hook.close()
    # nothing of the hook stays in the model between saved steps: no spies, Keras's own steps
    functions = [model.train_function, model.test_function, model.predict_function]
    leftovers = sum("call" in vars(layer) for layer in [model, *model.layers])
    leftovers += sum("KerasHook" in getattr(function, "__qualname__", "") for function in functions)
    np.savez(
        record,
        weight_names=np.array([w.path for w in model.weights]),
        modes=np.array([mode for mode, _ in recorder.logs]),
        losses=np.array([logs.get("loss", np.nan) for _, logs in recorder.logs]),
        maes=np.array([logs.get("mae", np.nan) for _, logs in recorder.logs]),
        predictions=predictions,
        leftovers=np.array(leftovers),
        x=X,
        y=Y,
        **{f"weights_{i}": np.stack([step[i] for step in recorder.weights]) for i in range(len(model.weights))},
    )


class FailingLate(tg.KerasHook):
    """Fails once gradient and output capture are under way (spies installed, step swapped)."""

    def capture(self, name, value):
        if name.startswith("gradients/") or "_output_" in name:
            raise RuntimeError("injected failure")
        super().capture(name, value)


def _failing_variant(*args, **kwargs):
    def run(state, data):
        raise RuntimeError("injected failure in the capture step")

    return run


def failopen(out_dir: str, record: str) -> None:
    import trainguard.hooks.keras as hook_module

    results = {}
    hooks = {
        "late": lambda: FailingLate(
            f"{out_dir}/late", save_config=tg.SaveConfig(save_interval=1), include_collections=["gradients", "outputs"]
        ),
        "variant": lambda: tg.KerasHook(
            f"{out_dir}/variant",
            save_config=tg.SaveConfig(save_interval=1),
            include_collections=["gradients", "outputs"],
        ),
    }
    real_variant = hook_module.jax_capture_variant
    for label, make in (("plain", None), *hooks.items()):
        # only the JAX backend builds capture steps: on torch "variant" is a plain hooked run
        hook_module.jax_capture_variant = _failing_variant if label == "variant" else real_variant
        callbacks = [make()] if make else []
        model = build_model()
        history = model.fit(X, Y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
        results[f"{label}_loss"] = np.array(history.history["loss"])
        for index, weight in enumerate(model.weights):
            results[f"{label}_weight_{index}"] = np.array(keras.ops.convert_to_numpy(weight))
        for callback in callbacks:
            results[f"{label}_enabled"] = np.array(callback.enabled)
            callback.close()
    np.savez(record, **results)


class Block(keras.layers.Layer):
    """A custom layer holding layers: found through the layer, not through ``model.layers``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = keras.layers.Conv2D(4, 3, activation="relu", name="conv")
        self.bn = keras.layers.BatchNormalization(name="bn")

    def call(self, x, training=None):
        return self.bn(self.conv(x), training=training)


class Net(keras.Model):
    def __init__(self):
        super().__init__(name="net")
        self.block = Block(name="block")
        self.drop = keras.layers.Dropout(0.3, name="drop")
        self.flat = keras.layers.Flatten(name="flat")
        self.head = keras.layers.Dense(3, name="head")

    def call(self, x, training=None):
        return self.head(self.flat(self.drop(self.block(x, training=training), training=training)))


def subclassed(out_dir: str, record: str) -> None:
    """A subclassed model with a nested custom layer, compiled with Keras's defaults and (JAX:
    the capture step is then not jitted) ``run_eagerly=True``; records the names, weights and
    enabled state of each run. (torch's ``jit_compile=True``, torch.compile, takes a minute to
    compile: not tested here; gradients are captured there, layer tensors are not.)"""
    rng = np.random.default_rng(2)
    x, y = rng.random((16, 8, 8, 1)).astype("float32"), rng.integers(0, 3, 16)
    results = {}
    runs = [("default", {})] + ([("eager", {"run_eagerly": True})] if keras.backend.backend() == "jax" else [])
    for label, options in runs:
        keras.utils.set_random_seed(0)
        model = Net()
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), **options)
        recorder = Recorder()
        hook = tg.KerasHook(
            f"{out_dir}/{label}",
            save_config=tg.SaveConfig(save_interval=2),
            include_collections=["weights", "biases", "gradients", "losses", "outputs"],
        )
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[recorder, hook])
        hook.close()
        results[f"{label}_enabled"] = np.array(hook.enabled)
        results[f"{label}_paths"] = np.array([w.path for w in model.weights])
        for index in range(len(model.weights)):
            results[f"{label}_weights_{index}"] = np.stack([step[index] for step in recorder.weights])
    np.savez(record, **results)


if __name__ == "__main__":
    scenario, out, record_path = sys.argv[1:4]
    {"full": full, "failopen": failopen, "subclassed": subclassed}[scenario](out, record_path)
