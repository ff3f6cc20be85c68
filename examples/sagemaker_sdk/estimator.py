"""The SDK side of a SageMaker training job, as written for SageMaker (see README.md here).

Only the environment differs from a run on AWS: the endpoint variables point boto3 at trainguard.
"""

import os

import boto3
import sagemaker
from sagemaker.debugger import Rule, rule_configs
from sagemaker.pytorch import PyTorch

bucket = os.environ.get("BUCKET", "trainguard-examples")
here = os.path.dirname(os.path.abspath(__file__))
s3 = boto3.client("s3")
try:
    s3.create_bucket(Bucket=bucket)
except s3.exceptions.BucketAlreadyOwnedByYou:
    pass
rows = [f"{a / 10:.2f},{b / 10:.2f},{(a - b) / 10:.2f}" for a in range(8) for b in range(8)]
s3.put_object(Bucket=bucket, Key="datasets/xy/data.csv", Body="\n".join(rows).encode())

session = sagemaker.Session(boto_session=boto3.Session(region_name="us-east-1"), default_bucket=bucket)
estimator = PyTorch(
    entry_point="train.py",
    source_dir=os.path.join(here, "source"),
    framework_version="2.1",
    py_version="py310",
    role="arn:aws:iam::000000000000:role/SageMakerRole",
    instance_count=1,
    instance_type="ml.m5.large",
    hyperparameters={"epochs": 3, "lr": float(os.environ.get("LR", "0.05"))},
    sagemaker_session=session,
    output_path=f"s3://{bucket}/output",
    rules=[Rule.sagemaker(rule_configs.exploding_tensor(), actions=rule_configs.ActionList(rule_configs.StopTraining()))],
    metric_definitions=[{"Name": "train:loss", "Regex": r"loss=([0-9.eE+-]+)"}],
    disable_profiler=True,
)
estimator.fit({"train": f"s3://{bucket}/datasets/xy"}, logs=True)
print("model:", estimator.model_data)
print("rules:", estimator.latest_training_job.rule_job_summary())
