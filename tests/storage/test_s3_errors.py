"""S3Store when things go wrong: no server, no bucket, no credentials, no boto3, bad URLs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.s3_server import free_port, set_dummy_credentials
from trainguard.errors import ConfigError, MissingDependencyError, ObjectNotFound, StorageError
from trainguard.storage import open_store
from trainguard.storage.s3 import MIN_PART_SIZE, S3Store


def test_unreachable_endpoint_fails_after_bounded_retries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    set_dummy_credentials(monkeypatch, tmp_path)
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused
    store = S3Store("bucket", "run", endpoint_url=endpoint, max_attempts=2)
    attempts = []
    store._client.meta.events.register("before-send.s3", lambda **kwargs: attempts.append(1))
    with pytest.raises(StorageError, match="cannot reach the S3 endpoint") as caught:
        store.read("index/a.json")
    assert len(attempts) == 2
    assert not isinstance(caught.value, ObjectNotFound)
    assert endpoint in str(caught.value) and "AWS_ENDPOINT_URL" in str(caught.value)
    once = S3Store("bucket", "run", endpoint_url=endpoint, max_attempts=1)  # no backoff: keeps the test fast
    for call in (
        lambda: once.write("index/a.json", b"x"),
        lambda: once.list("index/"),
        lambda: once.exists("index/a.json"),  # must raise, not pretend the key is absent
        lambda: once.delete("index/a.json"),
    ):
        with pytest.raises(StorageError, match="cannot reach the S3 endpoint") as caught:
            call()
        assert not isinstance(caught.value, ObjectNotFound)


def test_default_retries_are_bounded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    set_dummy_credentials(monkeypatch, tmp_path)
    config = S3Store("bucket", endpoint_url="http://127.0.0.1:1")._client.meta.config
    assert config.retries == {"mode": "standard", "total_max_attempts": 5}
    assert config.connect_timeout and config.read_timeout
    # Checksum trailers (botocore >= 1.36 default) break many S3-compatible servers.
    assert getattr(config, "request_checksum_calculation", "when_required") == "when_required"
    with pytest.raises(ConfigError, match="max_attempts"):
        S3Store("bucket", max_attempts=0)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")  # the user's own setting wins over the default
    assert S3Store("bucket", endpoint_url="http://127.0.0.1:1")._client.meta.config.retries["total_max_attempts"] == 3


def test_missing_bucket_says_so_and_how_to_create_it(s3_endpoint: str, s3_bucket: str) -> None:
    store = S3Store("tg-no-such-bucket", "run", endpoint_url=s3_endpoint)
    for call in (
        lambda: store.read("k"),
        lambda: store.write("k", b"x"),
        lambda: store.list(),
        lambda: store.size("k"),  # HEAD: a bare 404 that must not pass for a missing key
        lambda: store.exists("k"),
    ):
        with pytest.raises(StorageError, match="bucket 'tg-no-such-bucket' does not exist") as caught:
            call()
        assert not isinstance(caught.value, ObjectNotFound)
        assert "aws s3 mb s3://tg-no-such-bucket" in str(caught.value)


def test_missing_credentials_say_how_to_provide_them(
    s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    set_dummy_credentials(monkeypatch, tmp_path)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    store = S3Store("bucket", endpoint_url=s3_endpoint)
    with pytest.raises(StorageError, match="no AWS credentials found.*AWS_ACCESS_KEY_ID"):
        store.read("k")


def test_open_store_passes_the_endpoint(s3_endpoint: str, s3_bucket: str) -> None:
    store = open_store(f"s3://{s3_bucket}/runs/a", endpoint_url=s3_endpoint)
    assert isinstance(store, S3Store)
    assert store.url == f"s3://{s3_bucket}/runs/a"
    store.write("index/x.json", b"{}")
    assert store.read("index/x.json") == b"{}"


def test_endpoint_from_the_environment(s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # botocore itself reads AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL; S3Store must not get in the way.
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    store = open_store(f"s3://{s3_bucket}")
    assert store.endpoint_url.rstrip("/") == s3_endpoint
    store.write("k", b"v")
    assert store.list() == ["k"]
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    assert open_store(f"s3://{s3_bucket}").read("k") == b"v"


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix"])
def test_url_without_bucket_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match="names no bucket"):
        S3Store.from_url(url)


def test_from_url_splits_bucket_and_prefix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    set_dummy_credentials(monkeypatch, tmp_path)
    assert S3Store.from_url("s3://bucket").prefix == ""
    assert S3Store.from_url("s3://bucket/").prefix == ""
    store = S3Store.from_url("s3://bucket/a/b/")
    assert (store.bucket, store.prefix, store.url) == ("bucket", "a/b", "s3://bucket/a/b")
    assert store.full_key("index/x") == "a/b/index/x"


def test_bad_settings_are_config_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    set_dummy_credentials(monkeypatch, tmp_path)
    with pytest.raises(ConfigError, match="minimum part size"):
        S3Store("bucket", multipart_threshold=MIN_PART_SIZE - 1)
    with pytest.raises(ConfigError, match="endpoint_url"):
        S3Store("bucket", endpoint_url="not a url")


def test_missing_boto3_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # makes `import boto3` raise ImportError
    message = "s3:// storage needs boto3: pip install 'trainguard[s3]'"
    with pytest.raises(MissingDependencyError, match="trainguard\\[s3\\]") as caught:
        S3Store("bucket")
    assert str(caught.value) == message
    assert (caught.value.package, caught.value.extra) == ("boto3", "s3")
    with pytest.raises(MissingDependencyError):
        open_store("s3://bucket/run")
