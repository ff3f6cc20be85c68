"""The real SageMaker SDK (2.257) against the compose stack: the same user job as on SageMaker.

The SDK uploads the source to the stack's S3 endpoint and calls CreateTrainingJob with an AWS
PyTorch image URI; the API (in its container, Docker launcher through the proxy) runs the job in
trainguard's training image under SageMaker's container contract, the uploader copies the capture
to S3 and a rule-runner container judges it. Skipped where Docker cannot be had.
"""

from __future__ import annotations

import io
import tarfile
import uuid

import boto3
import pytest

from tests.e2e.stack import SAGEMAKER_KEY_ID, SAGEMAKER_SECRET, S3_KEY_ID, S3_SECRET
from tests.e2e.test_stack import stack  # noqa: F401  (module-scoped fixture: the compose stack)
from tests.services.sdk_env import run_sdk, sdk_python, seed_data, source_dir  # noqa: F401

pytestmark = pytest.mark.slow


def _s3(stack):  # noqa: ANN001, ANN202, F811
    return boto3.client(
        "s3", endpoint_url=stack.s3_url, region_name="us-east-1",
        aws_access_key_id=S3_KEY_ID, aws_secret_access_key=S3_SECRET,
    )  # fmt: skip


def _settings(stack, tmp_path, **extra):  # noqa: ANN001, ANN003, ANN202, F811
    s3 = _s3(stack)
    bucket = f"sdk-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=bucket)
    return s3, {
        "api_url": stack.url, "s3_url": stack.s3_url, "bucket": bucket, "key_id": SAGEMAKER_KEY_ID,
        "secret": SAGEMAKER_SECRET, "source_dir": str(source_dir(tmp_path)), "data_uri": seed_data(s3, bucket),
        **extra,
    }  # fmt: skip


def test_sdk_job_on_the_compose_stack_completes_with_its_model(stack, sdk_python, tmp_path):  # noqa: F811
    s3, settings = _settings(stack, tmp_path, lr=0.05, epochs=3, wait_logs=True)
    result = run_sdk(sdk_python, settings)
    stack.jobs.append(result["job_name"])
    assert result["status"] == "Completed", (result["failure_reason"], result["stdout"][-4000:])
    bucket, _, key = result["model_data"].removeprefix("s3://").partition("/")
    with tarfile.open(fileobj=io.BytesIO(s3.get_object(Bucket=bucket, Key=key)["Body"].read()), mode="r:gz") as tar:
        assert "model.pt" in tar.getnames()
    summary = {entry["RuleConfigurationName"]: entry for entry in result["rule_summary"]}
    assert summary["ExplodingTensor"]["RuleEvaluationStatus"] == "NoIssuesFound", result["rule_summary"]
    assert "epoch=2 loss=" in result["stdout"]  # fit(logs=True) streamed the container's log
    # the capture reached S3 under the SDK's debugger artifacts path
    prefix = result["debugger_artifacts_path"].removeprefix(f"s3://{bucket}/")
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    assert any(item["Key"].endswith("training_job_end.ts") for item in listed), [i["Key"] for i in listed][:20]


def test_faulty_sdk_job_on_the_compose_stack_is_stopped_by_its_rule(stack, sdk_python, tmp_path):  # noqa: F811
    _, settings = _settings(stack, tmp_path, lr=1e6, epochs=3000, wait_logs=False)
    result = run_sdk(sdk_python, settings)
    stack.jobs.append(result["job_name"])
    summary = {entry["RuleConfigurationName"]: entry for entry in result["rule_summary"]}
    assert summary["ExplodingTensor"]["RuleEvaluationStatus"] == "IssuesFound", result["rule_summary"]
    final = stack.wait_settled(result["job_name"])
    assert final["status"] == "Stopped", final
