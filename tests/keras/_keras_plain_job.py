"""An unmodified Keras 3 script (no trainguard in it) for the zero-code tests:
``KERAS_BACKEND=torch|jax trainguard run -- python _keras_plain_job.py [torch-first]``.

``torch-first`` imports torch before Keras, as a script that also uses torch's utilities does.
``smdebug-hook``: the script passes a hook of its own, as an smdebug script ported by its import
does (``KerasHook.create_from_json_file()``, no config file: the run's capture config).
"""

import sys

if "torch-first" in sys.argv[1:]:
    import torch  # noqa: F401

import keras
import numpy as np

keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x[:, :4].sum(axis=1) > 0).astype("int64")
model = keras.Sequential(
    [
        keras.Input((8,)),
        keras.layers.Dense(16, activation="relu", name="hidden"),
        keras.layers.Dense(16, activation="tanh", name="squash"),
        keras.layers.Dense(2, name="head"),
    ]
)
model.compile(optimizer=keras.optimizers.SGD(0.05), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
callbacks = []
if "smdebug-hook" in sys.argv[1:]:
    import trainguard.keras as tg

    callbacks = [tg.KerasHook.create_from_json_file()]
model.fit(x, y, batch_size=32, epochs=3, verbose=0, callbacks=callbacks)
model.evaluate(x[:64], y[:64], batch_size=32, verbose=0, callbacks=callbacks)
print("trained", keras.backend.backend())
