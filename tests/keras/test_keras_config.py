"""Keras hook construction in-process: configuration errors, JSON config, the public API."""

from __future__ import annotations

import json

import pytest

keras = pytest.importorskip("keras", reason="the Keras tests need keras>=3.5: pip install 'trainguard[keras]'")
tg = pytest.importorskip("trainguard.keras")

from trainguard.errors import ConfigError  # noqa: E402


def test_hook_is_a_keras_callback_with_smdebugs_api(tmp_path):
    hook = tg.KerasHook(str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=5))
    assert isinstance(hook, keras.callbacks.Callback)
    assert tg.Hook is tg.KerasHook and tg.modes.TRAIN == tg.ModeKeys.TRAIN
    assert {"weights", "biases", "gradients", "losses", "metrics", "sm_metrics", "scalars"} <= set(
        hook.include_collections
    )
    assert hook.get_collection("gradients").include_regex == ["^gradients/"]
    hook.close()


def test_unknown_collection_fails_at_construction(tmp_path):
    with pytest.raises(ConfigError, match="unknown collection.*'gradientz'"):
        tg.KerasHook(str(tmp_path / "run"), include_collections=["weights", "gradientz"])


def test_bad_regex_fails_at_construction(tmp_path):
    with pytest.raises(ConfigError, match="invalid regex"):
        tg.KerasHook(str(tmp_path / "run"), include_regex=["dense/(kernel"])


def test_finished_run_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "training_job_end.ts").write_text("")
    with pytest.raises(ConfigError, match="already holds a finished run"):
        tg.KerasHook(str(tmp_path / "run"))


def test_create_from_json_file_keeps_keras_naming(tmp_path, monkeypatch):
    config = {
        "LocalPath": str(tmp_path / "run"),
        "HookParameters": {"save_interval": "3", "include_regex": "hidden_output_0"},
        "CollectionConfigurations": [
            {
                "CollectionName": "gradients",
                "CollectionParameters": {"include_regex": "extra", "reductions": "l2_norm"},
            },
            {"CollectionName": "outputs"},
        ],
    }
    path = tmp_path / "debughookconfig.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(path))
    hook = tg.KerasHook.create_from_json_file()
    assert hook.out_dir == str(tmp_path / "run")
    assert hook.save_config.should_save_step(tg.modes.TRAIN, 3)
    assert not hook.save_config.should_save_step(tg.modes.TRAIN, 2)
    gradients = hook.get_collection("gradients")
    assert gradients.include_regex == ["^gradients/", "extra"]  # not PyTorch's "^gradient"
    assert gradients.reduction_config is not None and gradients.reduction_config.norms
    assert hook.get_collection("weights").include_regex == []  # PyTorch's ".*weight" regex is not Keras naming
    assert {"outputs", "metrics", "default"} <= set(hook.include_collections)
    hook.close()


def test_bad_json_config_names_the_key(tmp_path):
    path = tmp_path / "debughookconfig.json"
    path.write_text(json.dumps({"LocalPath": str(tmp_path / "run"), "HookParameters": {"save_intervall": "3"}}))
    with pytest.raises(ConfigError, match="save_intervall"):
        tg.KerasHook.create_from_json_file(str(path))
