"""The real SageMaker Python SDK (2.257) against trainguard's SageMaker endpoint, job unchanged.

A user's ``PyTorch(entry_point=..., source_dir=..., rules=[...]).fit({"train": "s3://..."})``
with only the endpoints pointed at trainguard (AWS_ENDPOINT_URL_SAGEMAKER/_S3, read by botocore).
The SDK uploads the source to S3 (moto server), sends CreateTrainingJob with an AWS PyTorch
image URI, and reads back the status, model artifacts, rule summary and debugger artifacts
path. The job runs for real on the local launcher under SageMaker's container contract.
"""

from __future__ import annotations

import pytest

from tests.s3_server import s3_bucket, s3_client  # noqa: F401  (fixtures by name)
from tests.services.conftest import SAGEMAKER_KEY_ID, SAGEMAKER_SECRET, wait_for
from tests.services.sdk_env import run_sdk as _run_sdk
from tests.services.sdk_env import sdk_python  # noqa: F401  (fixture by name)
from tests.services.sdk_env import seed_data as _seed_data
from tests.services.sdk_env import source_dir as _source_dir

pytestmark = pytest.mark.slow


def test_pytorch_estimator_fit_unchanged(api_factory, s3_endpoint, s3_bucket, sdk_python, tmp_path, monkeypatch):  # noqa: F811
    api = api_factory(S3_ENDPOINT_URL=s3_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    client = s3_client(s3_endpoint)
    settings = {
        "api_url": api.url, "s3_url": s3_endpoint, "bucket": s3_bucket, "key_id": SAGEMAKER_KEY_ID,
        "secret": SAGEMAKER_SECRET, "source_dir": str(_source_dir(tmp_path)), "data_uri": _seed_data(client, s3_bucket),
        "lr": 0.05, "epochs": 3, "wait_logs": True,
    }  # fmt: skip
    result = _run_sdk(sdk_python, settings)
    assert result["failure"] is None, result
    assert result["status"] == "Completed" and result["has_times"], result
    # estimator.model_data is the model.tar.gz the job-side runner packed from /opt/ml/model
    assert result["model_data"].startswith(f"s3://{s3_bucket}/output/"), result
    bucket, _, key = result["model_data"].removeprefix("s3://").partition("/")
    archive = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        assert "model.pt" in tar.getnames()
    summary = {entry["RuleConfigurationName"]: entry for entry in result["rule_summary"]}
    assert "ExplodingTensor" in summary, result["rule_summary"]
    assert summary["ExplodingTensor"]["RuleEvaluationStatus"] == "NoIssuesFound", result["rule_summary"]
    # create_trial() on the SDK's debugger artifacts path: the local job's run was uploaded there
    from trainguard.trials import create_trial

    assert result["debugger_artifacts_path"].startswith(f"s3://{s3_bucket}/debug/")  # the user's DebuggerHookConfig
    trial = create_trial(result["debugger_artifacts_path"])
    assert trial.steps() and any("loss" in name.lower() for name in trial.tensor_names()), trial.tensor_names()
    assert result["hyperparameters"]["epochs"] == "3", result
    # fit(logs=True) streamed the training log through the CloudWatch-Logs-compatible calls ...
    assert "epoch=2 loss=" in result["stdout"], result["stdout"][-3000:]
    # ... and the metric definition's regex was applied to it (the last epoch's loss)
    last_loss = float(result["stdout"].split("epoch=2 loss=")[1].split()[0])
    metrics = {m["MetricName"]: m["Value"] for m in result["final_metrics"] or []}
    assert metrics.get("train:loss") == pytest.approx(last_loss), result["final_metrics"]


def test_faulty_estimator_job_is_stopped_by_its_rule_action(api_factory, s3_endpoint, s3_bucket, sdk_python, tmp_path):  # noqa: F811
    """lr 1e6 makes the loss non-finite within a few steps; the rule's StopTraining action stops it."""
    api = api_factory(S3_ENDPOINT_URL=s3_endpoint)
    client = s3_client(s3_endpoint)
    settings = {
        "api_url": api.url, "s3_url": s3_endpoint, "bucket": s3_bucket, "key_id": SAGEMAKER_KEY_ID,
        "secret": SAGEMAKER_SECRET, "source_dir": str(_source_dir(tmp_path)), "data_uri": _seed_data(client, s3_bucket),
        "lr": 1e6, "epochs": 3000, "wait_logs": False,
    }  # fmt: skip
    result = _run_sdk(sdk_python, settings)
    summary = {entry["RuleConfigurationName"]: entry for entry in result["rule_summary"]}
    assert summary["ExplodingTensor"]["RuleEvaluationStatus"] == "IssuesFound", result["rule_summary"]
    # 3000 epochs take about a minute; the action stops the job long before. The SDK's wait ends
    # at Stopping (SDK 2.x counts only InProgress/Created as running), then the job is Stopped.
    assert result["status"] in ("Stopping", "Stopped"), result
    sagemaker = api.sagemaker()
    final = wait_for(
        lambda: (d := sagemaker.describe_training_job(TrainingJobName=result["job_name"]))["TrainingJobStatus"]
        in ("Stopped", "Completed", "Failed") and d,
        timeout=60,
        what="the stopped job to end",
    )
    assert final["TrainingJobStatus"] == "Stopped", final
    assert final["TrainingEndTime"] > final["TrainingStartTime"]
