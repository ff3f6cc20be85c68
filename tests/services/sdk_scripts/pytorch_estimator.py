"""A SageMaker SDK 2.x user's job, unchanged but for the endpoints (run in the SDK venv).

Argument: a JSON object {api_url, s3_url, bucket, key_id, secret, source_dir, data_uri, lr,
wait_logs}. Prints one JSON line with what the SDK reads back. The endpoints are given the way a
user points any boto3 program elsewhere: AWS_ENDPOINT_URL_SAGEMAKER, _S3 and _CLOUDWATCH_LOGS (botocore reads them itself).
"""

import json
import os
import sys

settings = json.loads(sys.argv[1])
os.environ["AWS_ENDPOINT_URL_SAGEMAKER"] = settings["api_url"]
os.environ["AWS_ENDPOINT_URL_CLOUDWATCH_LOGS"] = settings["api_url"]
os.environ["AWS_ENDPOINT_URL_S3"] = settings["s3_url"]
os.environ["SAGEMAKER_SUPPRESS_V2_WARNING"] = "1"
# No route to AWS here: the SDK's telemetry off, as examples/sagemaker_sdk/README.md tells users.
os.environ["SAGEMAKER_USER_CONFIG_OVERRIDE"] = os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "examples", "sagemaker_sdk", "sagemaker-config.yaml"
)

import boto3  # noqa: E402
import sagemaker  # noqa: E402
from sagemaker.debugger import CollectionConfig, DebuggerHookConfig, Rule, rule_configs  # noqa: E402
from sagemaker.pytorch import PyTorch  # noqa: E402

boto_session = boto3.Session(
    aws_access_key_id=settings["key_id"], aws_secret_access_key=settings["secret"], region_name="us-east-1"
)
session = sagemaker.Session(boto_session=boto_session, default_bucket=settings["bucket"])

estimator = PyTorch(
    entry_point="train.py",
    source_dir=settings["source_dir"],
    framework_version="2.1",
    py_version="py310",
    role="arn:aws:iam::000000000000:role/SageMakerRole",
    instance_count=1,
    instance_type="ml.m5.large",
    hyperparameters={"epochs": settings.get("epochs", 3), "lr": settings["lr"]},
    sagemaker_session=session,
    output_path=f"s3://{settings['bucket']}/output",
    # SageMaker's documented way to stop a job on a finding: the rule's StopTraining action.
    # An explicit DebuggerHookConfig, as users write it: where the tensors go, which collections.
    debugger_hook_config=DebuggerHookConfig(
        s3_output_path=f"s3://{settings['bucket']}/debug",
        hook_parameters={"save_interval": "2"},
        collection_configs=[CollectionConfig("losses", parameters={"save_interval": "1"}),
                            CollectionConfig("gradients"), CollectionConfig("weights")],
    ),
    rules=[Rule.sagemaker(rule_configs.exploding_tensor(), actions=rule_configs.ActionList(rule_configs.StopTraining()))],
    metric_definitions=[{"Name": "train:loss", "Regex": r"loss=([0-9.eE+-]+|nan|inf)"}],
    disable_profiler=True,
)
failure = None
try:
    estimator.fit({"train": settings["data_uri"]}, wait=True, logs=bool(settings.get("wait_logs")))
except Exception as error:  # the SDK raises UnexpectedStatusException for a failed job
    failure = f"{type(error).__name__}: {error}"
job = estimator.latest_training_job
description = job.describe()
result = {
    "job_name": job.name,
    "failure": failure,
    "status": description["TrainingJobStatus"],
    "failure_reason": description.get("FailureReason"),
    "model_data": estimator.model_data if failure is None else None,
    "debugger_artifacts_path": estimator.latest_job_debugger_artifacts_path(),
    "rule_summary": job.rule_job_summary(),
    "final_metrics": description.get("FinalMetricDataList"),
    "hyperparameters": description.get("HyperParameters"),
    "secondary_transitions": [t["Status"] for t in description.get("SecondaryStatusTransitions", [])],
    "has_times": "TrainingStartTime" in description and "TrainingEndTime" in description,
}
print("SDK-RESULT " + json.dumps(result, default=str), flush=True)
