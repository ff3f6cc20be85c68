"""The compose stack's S3 endpoint (containers/rules/s3_endpoint.py), run as the real server process
on a data directory that is a small real tmpfs: object bytes go to that disk (not to memory), a
write that does not fit is answered 507 StorageFull (never a generic 500), and deleting objects
makes room again. Mounting the tmpfs needs root; elsewhere these tests skip.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.s3_endpoint_process import StackS3Endpoint as Endpoint
from tests.reliability.faults import mount_small_disk, unmount

MIB = 1 << 20


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "s3-data"
    try:
        mount_small_disk(disk, 8)
    except OSError as error:
        pytest.skip(f"needs a tmpfs for the endpoint's data (root): {error}")
    try:
        yield disk
    finally:
        unmount(disk)


def _error(call) -> tuple[int, str, str]:  # noqa: ANN001
    import botocore.exceptions

    with pytest.raises(botocore.exceptions.ClientError) as raised:
        call()
    response = raised.value.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"], response["Error"]["Message"]


def test_object_bytes_live_on_the_data_volume(small_disk: Path, tmp_path: Path) -> None:
    endpoint = Endpoint(small_disk, tmp_path / "s3.log", "--min-free-mb", "0")
    try:
        s3 = endpoint.client()
        s3.create_bucket(Bucket="bytes")
        before = endpoint.used_bytes()
        # 3 MiB: under moto's own 5 MiB buffer, where it would have stayed in the process's memory.
        body = os.urandom(3 * MIB)
        s3.put_object(Bucket="bytes", Key="three-mib", Body=body)
        assert endpoint.used_bytes() - before >= 3 * MIB
        assert s3.get_object(Bucket="bytes", Key="three-mib")["Body"].read() == body
        s3.delete_object(Bucket="bytes", Key="three-mib")
        assert endpoint.used_bytes() - before < MIB  # deleting gives the space back
    finally:
        endpoint.stop()


def test_a_write_past_the_reserve_is_refused_as_storage_full_and_deleting_makes_room(
    small_disk: Path, tmp_path: Path
) -> None:
    endpoint = Endpoint(small_disk, tmp_path / "s3.log", "--min-free-mb", "4")
    try:
        s3 = endpoint.client()
        s3.create_bucket(Bucket="full")
        s3.put_object(Bucket="full", Key="a", Body=os.urandom(2 * MIB))  # 8 - 2 = 6 MiB free
        status, code, message = _error(lambda: s3.put_object(Bucket="full", Key="b", Body=os.urandom(3 * MIB)))
        assert (status, code) == (507, "StorageFull") and "full" in message, message
        # Reads and listings still answer; what was stored is intact.
        assert [o["Key"] for o in s3.list_objects_v2(Bucket="full")["Contents"]] == ["a"]
        s3.delete_object(Bucket="full", Key="a")
        s3.put_object(Bucket="full", Key="b", Body=os.urandom(3 * MIB))
        assert s3.head_object(Bucket="full", Key="b")["ContentLength"] == 3 * MIB
    finally:
        endpoint.stop()


def test_a_disk_that_runs_out_under_a_write_is_storage_full_not_a_500(tmp_path: Path) -> None:
    """No reserve, and a disk with room for bytes but only a few files (inodes): the write itself
    meets ENOSPC inside moto, past the reserve check."""
    disk = tmp_path / "few-inodes"
    disk.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,nr_inodes=8", "tmpfs", str(disk)],
                            capture_output=True, text=True)  # fmt: skip
    if result.returncode != 0:
        pytest.skip(f"needs a tmpfs for the endpoint's data (root): {result.stderr.strip()}")
    endpoint = None
    try:
        endpoint = Endpoint(disk, tmp_path / "s3.log", "--min-free-mb", "0")
        s3 = endpoint.client()
        s3.create_bucket(Bucket="inodes")
        import botocore.exceptions

        stored, refused = [], []
        for index in range(12):
            try:
                s3.put_object(Bucket="inodes", Key=f"k{index}", Body=os.urandom(1000))
                stored.append(f"k{index}")
            except botocore.exceptions.ClientError as error:
                response = error.response
                refused.append((response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"]))
        assert stored and refused, (stored, refused)
        assert set(refused) == {(507, "StorageFull")}, refused
        s3.delete_object(Bucket="inodes", Key=stored[0])
        s3.put_object(Bucket="inodes", Key="after-delete", Body=b"fits again")
        assert s3.get_object(Bucket="inodes", Key="after-delete")["Body"].read() == b"fits again"
    finally:
        if endpoint is not None:
            endpoint.stop()
        unmount(disk)
