"""The Keras hook takes a CaptureConfig (issue 47): its schedule, its collection entries applied to
Keras's own collections, and the PyTorch hook's overhead budget left out."""

from __future__ import annotations

from pathlib import Path

from trainguard.config import CaptureConfig, SaveConfig
from trainguard.modes import ModeKeys


def test_the_keras_hook_takes_the_config(tmp_path: Path) -> None:
    from trainguard.keras import KerasHook

    config = CaptureConfig(
        out_dir=str(tmp_path / "run"), save_config=SaveConfig(save_interval=4), overhead_budget=0.2,
        collection_configurations=[{"CollectionName": "outputs", "CollectionParameters": {"save_interval": "2"}}],
    )  # fmt: skip
    hook = KerasHook(config=config, dry_run=True)
    try:
        assert hook.save_config.get_save_config(ModeKeys.TRAIN).save_interval == 4
        assert hook.config.overhead_budget is None
        outputs = hook.get_collection("outputs")
        assert outputs.save_config is not None
        assert outputs.save_config.get_save_config(ModeKeys.TRAIN).save_interval == 2
    finally:
        hook.close()
