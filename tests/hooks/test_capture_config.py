"""CaptureConfig (issue 47): one frozen, validated capture config that the three hooks take and
that ``trainguard run`` hands its training command as one JSON value, read back by the same
function that checked it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.config import CaptureConfig, ReductionConfig, SaveConfig, SaveConfigMode
from trainguard.config.capture_config import CAPTURE_VARIABLE, ZERO_CODE_COLLECTIONS, ZERO_CODE_SAVE_INTERVAL
from trainguard.errors import ConfigError
from trainguard.modes import ModeKeys
from trainguard.zero_code import capture_config

ROOT = Path(__file__).resolve().parents[2]


def _every_field(out_dir: str) -> CaptureConfig:
    return CaptureConfig(
        out_dir=out_dir,
        save_config=SaveConfig(
            mode_save_configs={ModeKeys.EVAL: SaveConfigMode(save_steps=(1, 4))}, save_interval=3, start_step=2
        ),
        reduction_config=ReductionConfig(reductions=("mean",), abs_norms=("l2",), save_shape=True),
        include_collections=["weights", "custom"],
        include_regex="fc.*",
        save_all=True,
        include_workers="all",
        other_workers_collections=(),
        export_tensorboard=True,
        tensorboard_dir="/tmp/tb",
        writer="thread",
        overhead_budget=0.05,
        overhead_max_interval=40,
        max_pending_bytes=1 << 20,
        endpoint_url="http://127.0.0.1:9",
        profile="p",
        region="eu-west-1",
        collection_configurations=[
            {"CollectionName": "custom", "CollectionParameters": {"include_regex": "relu.*", "save_interval": "7"}}
        ],
    )


def test_the_serialised_config_reads_back_equal_field_by_field(tmp_path: Path) -> None:
    config = _every_field(str(tmp_path))
    back = CaptureConfig.from_json(config.to_json())
    assert back == config and back.to_json() == config.to_json()
    assert back.include_regex == ("fc.*",) and back.other_workers_collections == ()
    assert back.save_config is not None and back.save_config.to_dict() == config.save_config.to_dict()  # type: ignore[union-attr]
    assert back.save_config.get_save_config(ModeKeys.EVAL).save_steps == (1, 4)
    assert back.save_config.get_save_config(ModeKeys.TRAIN).save_interval == 3
    assert back.reduction_config == config.reduction_config
    assert CaptureConfig.from_json(CaptureConfig().to_json()) == CaptureConfig()
    assert config != config.replace(save_config=SaveConfig(save_interval=4))


def test_the_config_is_frozen_and_its_collections_are_a_copy(tmp_path: Path) -> None:
    entries = [{"CollectionName": "custom", "CollectionParameters": {"include_regex": "a"}}]
    config = CaptureConfig(out_dir=str(tmp_path), collection_configurations=entries)
    entries[0]["CollectionName"] = "changed"
    assert config.collection_configurations[0]["CollectionName"] == "custom"
    with pytest.raises(AttributeError):
        config.out_dir = "elsewhere"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("include_workers", "some"),
        ("overhead_budget", 1.0),
        ("overhead_budget", "lots"),
        ("overhead_max_interval", 0),
        ("overhead_max_interval", 2.5),
        ("include_regex", "(unclosed"),
        ("save_config", {"save_interval": 3}),
        ("reduction_config", "mean"),
        ("max_pending_bytes", 0),
        ("save_all", "yes"),
        ("include_collections", [1, 2]),
        ("out_dir", ""),
        ("collection_configurations", [{"CollectionName": "x", "CollectionParameters": {"typo": 1}}]),
    ],
)
def test_a_bad_field_is_a_config_error_naming_it(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as raised:
        CaptureConfig(**{field: value})  # type: ignore[arg-type]
    expected = "typo" if field == "collection_configurations" else field
    assert expected in str(raised.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "not valid JSON"),
        ('{"format": 99}', "format"),
        ('{"format": 1, "save_intervall": 3}', "save_intervall"),
        ('{"format": 1, "include_workers": "many"}', "include_workers"),
        ('{"format": 1, "save_config": {"modes": {"TRAIN": {"save_interval": -1}}, "explicit": []}}', "save_interval"),
        ('{"format": 1, "reduction_config": {"reductions": ["median"]}}', "median"),
    ],
)
def test_a_malformed_serialised_config_names_the_variable_and_the_field(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as raised:
        capture_config({CAPTURE_VARIABLE: text})
    assert CAPTURE_VARIABLE in str(raised.value) and says in str(raised.value)


def test_the_serialised_config_wins_over_the_hand_set_variables(tmp_path: Path) -> None:
    config = CaptureConfig(out_dir=str(tmp_path / "a"), save_config=SaveConfig(save_interval=3))
    environ = {CAPTURE_VARIABLE: config.to_json(), "TRAINGUARD_OUT_DIR": str(tmp_path / "b"),
               "TRAINGUARD_SAVE_INTERVAL": "1"}  # fmt: skip
    assert capture_config(environ) == config


def test_hand_set_variables_get_the_zero_code_defaults(tmp_path: Path) -> None:
    config = capture_config({"TRAINGUARD_OUT_DIR": str(tmp_path)})
    assert config.out_dir == str(tmp_path) and config.include_collections == ZERO_CODE_COLLECTIONS
    assert config.save_config is not None
    assert config.save_config.get_save_config(ModeKeys.TRAIN).save_interval == ZERO_CODE_SAVE_INTERVAL
    with pytest.raises(ConfigError, match="TRAINGUARD_SAVE_INTERVAL"):
        capture_config({"TRAINGUARD_OUT_DIR": str(tmp_path), "TRAINGUARD_SAVE_INTERVAL": "often"})


def test_the_pytorch_hook_takes_the_config_or_the_arguments_not_both(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import trainguard.pytorch as tg

    config = _every_field(str(tmp_path / "run")).replace(writer=None, include_workers="one", save_all=False)
    hook = tg.Hook(config=config, dry_run=True)
    try:
        assert hook.config is config and hook.out_dir == config.out_dir
        assert hook.save_config.to_dict() == config.save_config.to_dict()  # type: ignore[union-attr]
        assert hook.reduction_config == config.reduction_config
        # the config's collection entries are applied to the hook's own collections
        custom = hook.get_collection("custom")
        assert "relu.*" in custom.include_regex and custom.save_config is not None
        assert custom.save_config.get_save_config(ModeKeys.TRAIN).save_interval == 7
        assert {"weights", "custom", "losses", "scalars", "default"} <= set(hook.include_collections)
    finally:
        hook.close()
    with pytest.raises(ConfigError, match="not both: got save_config"):
        tg.Hook(config=config, save_config=tg.SaveConfig(save_interval=2), dry_run=True)
    by_arguments = tg.Hook(out_dir=str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=2), dry_run=True)
    try:
        assert by_arguments.config == CaptureConfig(out_dir=str(tmp_path / "run"), save_config=by_arguments.save_config)
    finally:
        by_arguments.close()


def test_the_xgboost_hook_takes_the_config_with_its_own_defaults(tmp_path: Path) -> None:
    pytest.importorskip("xgboost")
    from trainguard.hooks.xgboost import DEFAULT_XGBOOST_SAVE_INTERVAL
    from trainguard.xgboost import Hook

    hook = Hook(config=CaptureConfig(out_dir=str(tmp_path / "run"), overhead_budget=0.5), dry_run=True)
    try:
        assert hook.save_config.get_save_config(ModeKeys.TRAIN).save_interval == DEFAULT_XGBOOST_SAVE_INTERVAL
        assert hook.config.overhead_budget is None  # the budget is the PyTorch hook's
        assert "metrics" in hook.include_collections
    finally:
        hook.close()
    with pytest.raises(ConfigError, match="not both"):
        Hook(config=CaptureConfig(out_dir=str(tmp_path / "run")), include_regex="x", dry_run=True)


def test_trainguard_run_hands_the_script_one_value_and_nothing_from_its_own_environment(tmp_path: Path) -> None:
    """The script's hook reads the run's schedule from TRAINGUARD_CAPTURE alone: a stale
    TRAINGUARD_SAVE_INTERVAL in the caller's environment reaches neither the script nor its hook."""
    pytest.importorskip("torch")
    from trainguard.trial import create_trial

    script = tmp_path / "train.py"
    script.write_text(
        "import json, os, torch\n"
        "print('VARIABLES', json.dumps(sorted(k for k in os.environ if k.startswith('TRAINGUARD_'))))\n"
        "model = torch.nn.Linear(3, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(7):\n"
        "    optimizer.zero_grad()\n"
        "    model(torch.ones(4, 3)).pow(2).mean().backward()\n"
        "    optimizer.step()\n"
    )
    hook_config = tmp_path / "hook.json"
    hook_config.write_text(json.dumps({"CollectionConfigurations": [{"CollectionName": "weights"}]}))
    out = tmp_path / "run"
    environment = {**os.environ, "TRAINGUARD_SAVE_INTERVAL": "1", "TRAINGUARD_OVERHEAD_BUDGET": "0.5"}
    done = subprocess.run(
        [sys.executable, "-m", "trainguard", "run", "--out", str(out), "--save-interval", "3",
         "--config", str(hook_config), "--", sys.executable, str(script)],
        env=environment, capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("VARIABLES "))
    variables = json.loads(line.removeprefix("VARIABLES "))
    assert CAPTURE_VARIABLE in variables
    assert not {"TRAINGUARD_SAVE_INTERVAL", "TRAINGUARD_OVERHEAD_BUDGET", "TRAINGUARD_CONFIG"} & set(variables)
    trial = create_trial(str(out), collection_wait_timeout=0)
    weight = trial.tensor_names(collection="weights")[0]
    assert trial.tensor(weight).steps() == [0, 3, 6]
