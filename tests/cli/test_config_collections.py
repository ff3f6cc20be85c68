"""An unknown collection name in a hook config (``--config``) is an error naming it and listing
the known ones, before training; under zero-code capture it is dropped with a warning and the
capture goes on (issue 46)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.cli import main
from trainguard.config.collection_names import FRAMEWORK_COLLECTIONS, known_collection_names
from trainguard.config.json_config import hook_kwargs_from_document
from trainguard.errors import ConfigError
from trainguard.zero_code import capture_config


def _config(include: str = "weights,weigths", collections: list[dict] | None = None) -> dict:
    return {"HookParameters": {"include_collections": include}, "CollectionConfigurations": collections or []}


def test_unknown_names_are_refused_naming_them_and_the_known_ones() -> None:
    with pytest.raises(ConfigError) as raised:
        hook_kwargs_from_document(_config())
    message = str(raised.value)
    assert "'weigths'" in message and "known collections are" in message and "weights" in message
    assert "'weights'" not in message.split("known")[0]  # only the unknown one is named as such
    with pytest.raises(ConfigError, match="'activations'"):
        hook_kwargs_from_document(_config("losses", [{"CollectionName": "activations"}]))


def test_built_in_names_of_any_framework_and_own_collections_with_a_regex_are_accepted() -> None:
    own = {"CollectionName": "attention", "CollectionParameters": {"include_regex": ".*attn.*"}}
    kwargs = hook_kwargs_from_document(_config("weights,losses,trees,metrics,attention", [own]))
    assert kwargs["include_collections"] == ["weights", "losses", "trees", "metrics", "attention"]
    assert kwargs["collection_manager"].get("attention").include_regex == [".*attn.*"]


def test_framework_names_are_the_hooks_own() -> None:
    """The names kept here so that reading a config loads no framework match the hooks'."""
    pytest.importorskip("xgboost")
    from trainguard.config.collections import DEFAULT_PYTORCH_COLLECTIONS
    from trainguard.hooks.xgboost import XGBOOST_COLLECTIONS

    keras_only = {"metrics", "sm_metrics", "optimizer_variables"}  # hooks/keras.py KERAS_COLLECTIONS
    assert FRAMEWORK_COLLECTIONS == (set(XGBOOST_COLLECTIONS) | keras_only) - set(DEFAULT_PYTORCH_COLLECTIONS)
    assert set(known_collection_names()) >= set(DEFAULT_PYTORCH_COLLECTIONS)


def test_trainguard_run_refuses_the_config_before_training(tmp_path: Path, capsys) -> None:
    config = tmp_path / "hook.json"
    config.write_text(json.dumps(_config()))
    marker = tmp_path / "training-ran"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    assert main(["run", "--out", str(tmp_path / "run"), "--config", str(config), "--", *command]) == 2
    assert "unknown collection(s) 'weigths'" in capsys.readouterr().err
    assert not marker.exists()


def test_zero_code_capture_drops_the_unknown_name_and_goes_on(tmp_path: Path, caplog) -> None:
    config = tmp_path / "hook.json"
    config.write_text(json.dumps(_config("weights,weigths,losses")))
    environ = {"TRAINGUARD_CONFIG": str(config), "TRAINGUARD_OUT_DIR": str(tmp_path / "run")}
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        config = capture_config(environ)
    assert config.include_collections == ("weights", "losses")
    assert any("'weigths'" in record.getMessage() for record in caplog.records)


def test_zero_code_training_with_a_bad_config_still_captures(tmp_path: Path) -> None:
    """A script started with zero-code capture armed (as a SageMaker container does) and a config
    naming an unknown collection trains and is captured, with one warning."""
    pytest.importorskip("torch")
    from trainguard.launch.options import BOOTSTRAP_DIR
    from trainguard.trial import create_trial

    config = tmp_path / "hook.json"
    parameters = {"include_collections": "weights,weigths,losses", "save_interval": "1"}
    config.write_text(json.dumps({"HookParameters": parameters}))
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(3, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loss_fn = torch.nn.MSELoss()\n"
        "for _ in range(3):\n"
        "    optimizer.zero_grad()\n"
        "    loss_fn(model(torch.ones(4, 3)), torch.zeros(4, 1)).backward()\n"
        "    optimizer.step()\n"
    )
    package_root = str(Path(__file__).resolve().parents[2] / "src")
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(BOOTSTRAP_DIR), package_root, os.environ.get("PYTHONPATH", "")]),
        "TRAINGUARD_ZERO_CODE": "1",
        "TRAINGUARD_OUT_DIR": str(tmp_path / "run"),
        "TRAINGUARD_CONFIG": str(config),
    }
    done = subprocess.run([sys.executable, str(script)], env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "unknown collection(s) 'weigths'" in done.stderr
    trial = create_trial(str(tmp_path / "run"), collection_wait_timeout=0)
    assert trial.steps() and trial.tensor_names(collection="weights")
