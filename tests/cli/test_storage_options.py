"""One set of storage options on every entry point (issue 46): each verb, the hooks and
``create_trial`` reach an ``s3://`` run with ``--endpoint-url``/``--profile``/``--region`` (or
``endpoint_url``/``profile``/``region``) and no AWS variable; a local path that does not exist is
an error at once. Against the real moto server of tests/s3_server.py."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from tests.s3_server import create_bucket, s3_client, set_dummy_credentials
from trainguard.cli import build_parser, main
from trainguard.storage.options import PROPAGATED_VARIABLES, resolve_storage_options, storage_options_from_args

torch = pytest.importorskip("torch")

STEPS = 12


def _train(out_dir: str, **storage: str) -> None:
    """A tiny healthy PyTorch training written by the hook straight to ``out_dir``."""
    import trainguard.pytorch as tg

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    hook = tg.Hook(out_dir, save_config=tg.SaveConfig(save_interval=1), **storage)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    inputs, labels = torch.randn(64, 4), torch.randint(0, 2, (64,))
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss_fn(model(inputs), labels).backward()
        optimizer.step()
    hook.close()


@pytest.fixture(scope="module")
def s3_run(s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A run the Hook wrote to S3 given only ``endpoint_url=`` (no AWS_ENDPOINT_URL set)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        set_dummy_credentials(monkeypatch, tmp_path_factory.mktemp("aws"))
        monkeypatch.setenv("TRAINGUARD_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        url = f"s3://{create_bucket(s3_endpoint)}/jobs/run-1"
        _train(url, endpoint_url=s3_endpoint)
    return url


@pytest.fixture
def no_endpoint_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    set_dummy_credentials(monkeypatch, tmp_path)  # unsets AWS_ENDPOINT_URL(_S3) and AWS_PROFILE
    for variable in PROPAGATED_VARIABLES.values():
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("TRAINGUARD_CACHE_DIR", str(tmp_path / "cache"))


def test_resolution_order_flag_then_trainguard_then_aws_variables() -> None:
    env = {
        "AWS_ENDPOINT_URL": "http://global:1",
        "AWS_ENDPOINT_URL_S3": "http://s3:2",
        "AWS_DEFAULT_PROFILE": "legacy",
        "AWS_DEFAULT_REGION": "us-west-1",
    }
    assert resolve_storage_options(environ=env).endpoint_url == "http://s3:2"
    assert resolve_storage_options(environ={"AWS_ENDPOINT_URL": "http://global:1"}).endpoint_url == "http://global:1"
    assert resolve_storage_options(environ=env).profile == "legacy"
    assert resolve_storage_options(environ=env).region == "us-west-1"
    env |= {"AWS_PROFILE": "dev", "AWS_REGION": "eu-west-3"}
    assert (resolve_storage_options(environ=env).profile, resolve_storage_options(environ=env).region) == (
        "dev",
        "eu-west-3",
    )
    env |= {"TRAINGUARD_STORAGE_ENDPOINT_URL": "http://tg:3", "TRAINGUARD_STORAGE_REGION": "ap-south-1"}
    assert resolve_storage_options(environ=env).endpoint_url == "http://tg:3"
    assert resolve_storage_options(environ=env).region == "ap-south-1"
    explicit = resolve_storage_options("http://flag:4", "mine", "sa-east-1", environ=env)
    assert (explicit.endpoint_url, explicit.profile, explicit.region) == ("http://flag:4", "mine", "sa-east-1")
    ignored = resolve_storage_options(environ={**env, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"})
    assert ignored.endpoint_url == "http://tg:3"  # only the AWS endpoint variables are ignored
    del env["TRAINGUARD_STORAGE_ENDPOINT_URL"]
    assert resolve_storage_options(environ={**env, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "1"}).endpoint_url is None


def test_every_verb_parses_the_same_options() -> None:
    parser = build_parser()
    storage = ["--endpoint-url", "http://e:9", "--region", "eu-west-3"]
    for words in (
        ["summary", "r", "--profile", "p"],
        ["tensorboard", "r", "o", "--profile", "p"],
        ["report", "r", "--profile", "p"],
        ["ui", "r", "--profile", "p"],
        ["rules", "run", "r", "--aws-profile", "p"],
        ["run", "--aws-profile", "p", "--profile"],  # --profile: the profiler, on run only
    ):
        tail = ["--", "python", "t.py"] if words[0] == "run" else []
        options = storage_options_from_args(parser.parse_args(words + storage + tail))
        assert (options.endpoint_url, options.profile, options.region) == ("http://e:9", "p", "eu-west-3"), words


def test_each_verb_reads_an_s3_run_with_endpoint_url_and_no_variable(
    s3_run: str, s3_endpoint: str, no_endpoint_variable: None, tmp_path: Path, capsys, monkeypatch
) -> None:
    flag = ["--endpoint-url", s3_endpoint]
    assert "AWS_ENDPOINT_URL" not in os.environ and "AWS_ENDPOINT_URL_S3" not in os.environ

    assert main(["summary", s3_run, "--json", *flag]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert s3_run in json.dumps(facts)

    board = tmp_path / "board"
    assert main(["tensorboard", s3_run, str(board), *flag]) == 0
    assert list((board / "TRAIN").glob("events.out.tfevents.*"))
    capsys.readouterr()

    page = tmp_path / "report.html"
    assert main(["report", s3_run, "-o", str(page), *flag]) == 0
    assert s3_run in page.read_text()
    capsys.readouterr()

    output = tmp_path / "rules"
    assert main(["rules", "run", s3_run, "--rule", "ExplodingTensor", "--output-dir", str(output), *flag]) == 0
    assert "ExplodingTensor  NoIssuesFound" in capsys.readouterr().out
    assert (output / "rule-output").is_dir() or list(output.rglob("*.json"))

    seen: dict[str, object] = {}

    def look_then_stop(seconds: float) -> None:
        url = capsys.readouterr().out.split(" at ")[-1].strip()
        with urllib.request.urlopen(f"{url}/api/runs", timeout=30) as response:  # noqa: S310 - loopback
            seen["runs"] = json.load(response)
        raise KeyboardInterrupt

    monkeypatch.setattr("trainguard.commands.ui.time.sleep", look_then_stop)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    assert main(["ui", s3_run, "--port", "0", *flag]) == 0
    assert "run-1" in json.dumps(seen["runs"])
    # the options were this command's only: nothing is left in the environment
    assert not any(variable in os.environ for variable in PROPAGATED_VARIABLES.values())


def test_rules_run_without_a_rule_runs_the_default_set(
    s3_run: str, s3_endpoint: str, no_endpoint_variable: None, tmp_path: Path, capsys
) -> None:
    """Healthy run, default set: some rules cannot apply (no XGBoost trees, no images) and the
    exit status stays 0; a rule the user names that cannot apply still exits 4."""
    from trainguard.rules.defaults import default_rule_specs

    common = [s3_run, "--endpoint-url", s3_endpoint, "--output-dir", str(tmp_path / "out"), "--json"]
    assert main(["rules", "run", *common]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    names = {line["configuration_name"] for line in lines if "configuration_name" in line}
    assert names == {spec.name for spec in default_rule_specs()}
    finals = {line["configuration_name"]: line for line in lines if "configuration_name" in line}
    assert any(str(line.get("status_details", "")).startswith("RuleNotEvaluated") for line in finals.values())
    assert main(["rules", "run", *common, "--rule", "TreeDepth"]) == 4


def test_profile_and_region_reach_the_client(
    s3_run: str, s3_endpoint: str, no_endpoint_variable: None, tmp_path: Path, monkeypatch, capsys
) -> None:
    """Credentials only in a profile: the verb works with --profile and not without it."""
    credentials = tmp_path / "credentials"
    credentials.write_text("[tg-test]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    config = tmp_path / "config"
    config.write_text("[profile tg-test]\nregion = eu-west-3\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.setenv("TRAINGUARD_CACHE_DIR", str(tmp_path / "fresh-cache"))

    assert main(["summary", s3_run, "--endpoint-url", s3_endpoint, "--profile", "tg-test"]) == 0
    assert "run-1" in capsys.readouterr().out
    assert main(["summary", s3_run, "--endpoint-url", s3_endpoint, "--profile", "no-such-profile"]) == 2
    assert "no-such-profile" in capsys.readouterr().err

    from trainguard.trial import create_trial

    trial = create_trial(s3_run, endpoint_url=s3_endpoint, profile="tg-test", region="ap-south-1", cache=False)
    assert trial.store._client.meta.region_name == "ap-south-1"
    from_profile = create_trial(s3_run, endpoint_url=s3_endpoint, profile="tg-test", cache=False)
    assert from_profile.store._client.meta.region_name == "eu-west-3"
    import trainguard.pytorch as tg

    hook = tg.Hook(f"{s3_run}-dry", endpoint_url=s3_endpoint, profile="tg-test", region="ca-central-1", dry_run=True)
    hook.close()  # a hook left open keeps its global optimizer hooks for the tests after this one
    assert hook.store._client.meta.region_name == "ca-central-1" and hook.store.endpoint_url == s3_endpoint
    if importlib.util.find_spec("xgboost") is not None:
        import trainguard.xgboost as tgx

        booster_hook = tgx.Hook(f"{s3_run}-xgb", endpoint_url=s3_endpoint, profile="tg-test", dry_run=True)
        booster_hook.close()
        assert booster_hook.store._client.meta.region_name == "eu-west-3"  # the profile's region


def test_trainguard_run_passes_endpoint_url_to_the_training_script(
    s3_endpoint: str, s3_bucket: str, tmp_path: Path
) -> None:
    """Zero-code capture to s3:// with only --endpoint-url: the hook in the child reaches it,
    while the script's own AWS variables are left as they were."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, torch
            print("child AWS_ENDPOINT_URL_S3", os.environ.get("AWS_ENDPOINT_URL_S3"))
            model = torch.nn.Linear(3, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(4):
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(torch.ones(8, 3)), torch.zeros(8, 1))
                loss.backward()
                optimizer.step()
            """
        )
    )
    url = f"s3://{s3_bucket}/zero-code"
    command = [sys.executable, "-m", "trainguard.cli", "run", "--out", url, "--save-interval", "1"]
    command += ["--endpoint-url", s3_endpoint, "--", sys.executable, str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "child AWS_ENDPOINT_URL_S3 None" in done.stdout
    keys = [item["Key"] for item in s3_client(s3_endpoint).list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert any(key.startswith("zero-code/index/") for key in keys), keys
    assert "zero-code/training_job_end.ts" in keys, keys


@pytest.mark.parametrize(
    "words",
    [
        ["rules", "run", "{missing}", "--rule", "ExplodingTensor", "--wait-timeout", "3"],
        ["rules", "run", "{missing}", "--wait-timeout", "3"],
        ["summary", "{missing}"],
        ["tensorboard", "{missing}", "{tmp}/board"],
        ["ui", "{missing}", "--port", "0"],
    ],
    ids=["rules-run", "rules-run-default", "summary", "tensorboard", "ui"],
)
def test_a_missing_path_is_an_error_at_once(words: list[str], tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    missing = "runs/typo-run"
    argv = [word.format(missing=missing, tmp=tmp_path) for word in words]
    monkeypatch.setattr("trainguard.commands.ui.time.sleep", lambda seconds: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert missing in error and "no such file or directory" in error
    assert list(tmp_path.iterdir()) == []  # no runs/typo-run/rule-output/, no board/


def test_an_existing_run_directory_without_a_run_says_it_waits(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "starting"
    empty.mkdir()
    assert main(["rules", "run", str(empty), "--rule", "ExplodingTensor", "--wait-timeout", "1"]) == 2
    captured = capsys.readouterr()
    assert f"waiting for the first step in {empty}" in captured.err and "Ctrl-C to stop" in captured.err
    assert "did not appear within 1 s" in captured.out
