"""SageMaker's training-container contract, job side, against a real S3 server (moto over HTTP).

The framework path runs the real ``sagemaker-training`` toolkit: it downloads the uploaded
``sourcedir.tar.gz``, installs its requirements and runs the entry point with the
hyperparameters as arguments, exactly as in SageMaker's framework containers.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from trainguard.services.sagemaker_container.channels import ChannelError, download_channel
from trainguard.services.sagemaker_container.contract import (
    CONTRACT_ENV,
    Channel,
    ContractError,
    JobContract,
    MlPaths,
    contract_from_request,
)

from tests.s3_server import s3_bucket, s3_client, s3_endpoint  # noqa: F401  (fixtures by name)

REPO = Path(__file__).resolve().parents[2]

TRAIN_PY = """
import argparse, json, os, sys
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int)
parser.add_argument("--lr", type=float)
parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR"))
args = parser.parse_args()
rows = open(os.path.join(os.environ["SM_CHANNEL_TRAIN"], "part-0.csv")).read().split()
if args.lr > 1:
    raise ValueError("learning rate far too high")
with open(os.path.join(args.model_dir, "model.json"), "w") as f:
    json.dump({"epochs": args.epochs, "lr": args.lr, "rows": len(rows),
               "hosts": json.loads(os.environ["SM_HOSTS"]), "channels": json.loads(os.environ["SM_CHANNELS"])}, f)
os.makedirs(os.environ["SM_OUTPUT_DATA_DIR"], exist_ok=True)
open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "metrics.txt"), "w").write("loss=0.1\\n")
print("trained", args.epochs)
"""


def _sourcedir() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in (("train.py", TRAIN_PY), ("requirements.txt", "")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _sdk_request(bucket: str, job: str, lr: str = "0.01") -> dict:
    """What SageMaker SDK 2.x sends for PyTorch(entry_point='train.py', source_dir=...).fit({'train': ...})."""
    return {
        "TrainingJobName": job,
        "AlgorithmSpecification": {"TrainingImage": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.1-cpu-py310",
                                   "TrainingInputMode": "File"},  # fmt: skip
        "HyperParameters": {
            "epochs": "2",
            "lr": json.dumps(lr),
            "sagemaker_program": json.dumps("train.py"),
            "sagemaker_submit_directory": json.dumps(f"s3://{bucket}/{job}/source/sourcedir.tar.gz"),
            "sagemaker_container_log_level": "20",
            "sagemaker_job_name": json.dumps(job),
            "sagemaker_region": json.dumps("us-east-1"),
        },
        "InputDataConfig": [
            {"ChannelName": "train", "DataSource": {"S3DataSource": {
                "S3DataType": "S3Prefix", "S3Uri": f"s3://{bucket}/data/train",
                "S3DataDistributionType": "FullyReplicated"}}},
        ],  # fmt: skip
        "OutputDataConfig": {"S3OutputPath": f"s3://{bucket}/output"},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
    }


def _run_job_side(contract: JobContract, base: Path, endpoint: str) -> subprocess.CompletedProcess:
    environment = {
        **os.environ,
        CONTRACT_ENV: contract.to_json(),
        "SAGEMAKER_BASE_DIR": str(base),
        "S3_ENDPOINT_URL": endpoint,
        "PYTHONPATH": str(REPO),
    }
    return subprocess.run(
        [sys.executable, "-m", "trainguard.services.sagemaker_container"],
        env=environment, cwd=str(REPO), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _seed(client, bucket: str, job: str) -> None:  # noqa: ANN001
    client.put_object(Bucket=bucket, Key=f"{job}/source/sourcedir.tar.gz", Body=_sourcedir())
    client.put_object(Bucket=bucket, Key="data/train/part-0.csv", Body=b"1,2\n3,4\n5,6\n")


def _model_archive(client, bucket: str, key: str) -> dict[str, bytes]:  # noqa: ANN001
    body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        return {member.name: tar.extractfile(member).read() for member in tar.getmembers() if member.isfile()}


def test_framework_job_runs_the_sdk_source_and_uploads_its_model(s3_bucket, s3_endpoint, tmp_path):  # noqa: F811
    pytest.importorskip("sagemaker_training")
    client = s3_client(s3_endpoint)
    job = "sdk-job-1"
    _seed(client, s3_bucket, job)
    contract = contract_from_request(_sdk_request(s3_bucket, job))
    assert contract.framework_mode
    base = tmp_path / "opt" / "ml"
    result = _run_job_side(contract, base, s3_endpoint)
    assert result.returncode == 0, result.stderr[-3000:]
    config = base / "input" / "config"
    assert json.loads((config / "resourceconfig.json").read_text())["hosts"] == ["algo-1"]
    assert json.loads((config / "inputdataconfig.json").read_text())["train"]["S3DistributionType"] == "FullyReplicated"
    assert json.loads((config / "hyperparameters.json").read_text())["epochs"] == "2"
    assert sorted(p.name for p in (base / "input" / "data" / "train").iterdir()) == ["part-0.csv"]
    files = _model_archive(client, s3_bucket, f"output/{job}/output/model.tar.gz")
    trained = json.loads(files["model.json"])
    assert trained == {"epochs": 2, "lr": 0.01, "rows": 3, "hosts": ["algo-1"], "channels": ["train"]}
    output = _model_archive(client, s3_bucket, f"output/{job}/output/output.tar.gz")
    assert output["metrics.txt"] == b"loss=0.1\n"
    assert not (base / "output" / "failure").exists()


def test_framework_job_failure_becomes_the_failure_reason(s3_bucket, s3_endpoint, tmp_path):  # noqa: F811
    pytest.importorskip("sagemaker_training")
    client = s3_client(s3_endpoint)
    job = "sdk-job-bad"
    _seed(client, s3_bucket, job)
    base = tmp_path / "opt" / "ml"
    result = _run_job_side(contract_from_request(_sdk_request(s3_bucket, job, lr="100")), base, s3_endpoint)
    assert result.returncode != 0
    reason = (base / "output" / "failure").read_text()
    assert "learning rate far too high" in reason
    # SageMaker uploads the (empty) model archive of a failed job too.
    assert _model_archive(client, s3_bucket, f"output/{job}/output/model.tar.gz") == {}


def test_entry_point_job_gets_the_sm_environment(s3_bucket, s3_endpoint, tmp_path):  # noqa: F811
    client = s3_client(s3_endpoint)
    _seed(client, s3_bucket, "ep")
    script = tmp_path / "print_env.py"
    script.write_text(
        "import json, os, sys\n"
        "keys = ['SM_CHANNEL_TRAIN', 'SM_MODEL_DIR', 'SM_HP_EPOCHS', 'SM_HPS', 'SM_CURRENT_HOST', 'SM_NUM_GPUS']\n"
        "json.dump({k: os.environ.get(k) for k in keys}, open(os.path.join(os.environ['SM_MODEL_DIR'], 'env.json'), 'w'))\n"
    )
    request = _sdk_request(s3_bucket, "ep")
    request["AlgorithmSpecification"]["ContainerEntrypoint"] = [sys.executable, str(script)]
    contract = contract_from_request(request)
    assert not contract.framework_mode
    base = tmp_path / "opt" / "ml"
    result = _run_job_side(contract, base, s3_endpoint)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(_model_archive(client, s3_bucket, "output/ep/output/model.tar.gz")["env.json"])
    assert seen["SM_CHANNEL_TRAIN"] == str(base / "input" / "data" / "train")
    assert seen["SM_MODEL_DIR"] == str(base / "model")
    assert seen["SM_HP_EPOCHS"] == "2" and json.loads(seen["SM_HPS"])["lr"] == "0.01"
    assert seen["SM_CURRENT_HOST"] == "algo-1" and seen["SM_NUM_GPUS"] == "0"


def test_sharded_and_manifest_channels(s3_bucket, s3_endpoint, tmp_path):  # noqa: F811
    client = s3_client(s3_endpoint)
    for index in range(5):
        client.put_object(Bucket=s3_bucket, Key=f"shards/part-{index}", Body=str(index).encode())
    sharded = Channel("train", f"s3://{s3_bucket}/shards/", distribution="ShardedByS3Key")
    got = []
    for host in range(2):
        target = tmp_path / f"host{host}"
        download_channel(client, sharded, target, host_index=host, host_count=2)
        got.append(sorted(p.name for p in target.iterdir()))
    assert got == [["part-0", "part-2", "part-4"], ["part-1", "part-3"]]
    manifest = [{"prefix": f"s3://{s3_bucket}/shards/"}, "part-1", "part-3"]
    client.put_object(Bucket=s3_bucket, Key="m.manifest", Body=json.dumps(manifest).encode())
    target = tmp_path / "manifest"
    download_channel(client, Channel("m", f"s3://{s3_bucket}/m.manifest", data_type="ManifestFile"), target)
    assert {p.name: p.read_text() for p in target.iterdir()} == {"part-1": "1", "part-3": "3"}


def test_a_key_escaping_the_channel_directory_is_refused(s3_bucket, s3_endpoint, tmp_path):  # noqa: F811
    client = s3_client(s3_endpoint)
    manifest = [{"prefix": f"s3://{s3_bucket}/x/"}, "../../escape"]
    client.put_object(Bucket=s3_bucket, Key="evil.manifest", Body=json.dumps(manifest).encode())
    with pytest.raises(ChannelError, match="outside the channel"):
        download_channel(client, Channel("m", f"s3://{s3_bucket}/evil.manifest", data_type="ManifestFile"),
                         tmp_path / "m")  # fmt: skip
    assert not (tmp_path / "escape").exists()


@pytest.mark.parametrize(
    ("change", "member"),
    [
        ({"InputDataConfig": "train"}, "InputDataConfig"),
        ({"InputDataConfig": [{"ChannelName": "a b"}]}, "InputDataConfig[0].ChannelName"),
        ({"InputDataConfig": [{"ChannelName": "t", "DataSource": {"S3DataSource": {"S3Uri": "/etc"}}}]},
         "InputDataConfig[0].DataSource.S3DataSource.S3Uri"),
        ({"HyperParameters": {"epochs": 2}}, "HyperParameters.epochs"),
        ({"ResourceConfig": {"InstanceCount": "2"}}, "ResourceConfig.InstanceCount"),
        ({"OutputDataConfig": {"S3OutputPath": "file:///tmp"}}, "OutputDataConfig.S3OutputPath"),
    ],
)
def test_bad_members_name_themselves(change, member):
    request = _sdk_request("bucket", "job")
    request.update(change)
    with pytest.raises(ContractError) as error:
        contract_from_request(request)
    assert str(error.value).startswith(member + ":")


def test_contract_round_trips_through_json(tmp_path):
    contract = contract_from_request(_sdk_request("bucket", "job"))
    again = JobContract.from_json(contract.to_json())
    assert again == contract
    paths = MlPaths(tmp_path)
    again.write_config(paths)
    assert json.loads((paths.config / "hyperparameters.json").read_text()) == dict(contract.hyperparameters)
    assert contract.model_artifact_uri() == "s3://bucket/output/job/output/model.tar.gz"
