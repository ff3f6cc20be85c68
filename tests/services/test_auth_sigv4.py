"""SigV4 on the SageMaker endpoint, key configuration, and state-file permissions.

Signatures are made by botocore itself (boto3 clients against the running API, or botocore's
SigV4Auth on a raw request); forgeries are built by hand from a genuine request. Nothing is mocked.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from trainguard.services.api.access_keys import AccessKeyStore
from trainguard.services.api.auth import SigV4Error, verify_sigv4
from trainguard.services.api.settings import Settings

from tests.services.conftest import SAGEMAKER_KEY_ID, SAGEMAKER_SECRET, TOKEN
from trainguard.errors import ConfigError

KEY_ID, SECRET = "AKIDUNITTEST0001", "unit-test-secret-0123456789"
TARGET = "SageMaker.ListTrainingJobs"


def _settings(**environ: str) -> Settings:
    return Settings.from_env(
        {"TRAINGUARD_API_TOKEN": TOKEN, "TRAINGUARD_SAGEMAKER_ACCESS_KEYS": f"{KEY_ID}:{SECRET}", **environ}
    )


def _signed(
    body: bytes = b"{}", *, key_id: str = KEY_ID, secret: str = SECRET, region: str = "us-east-1",
    service: str = "sagemaker", url: str = "http://127.0.0.1:8080/", target: str = TARGET,
) -> AWSRequest:  # fmt: skip
    request = AWSRequest(
        method="POST", url=url, data=body,
        headers={"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": target},
    )  # fmt: skip
    SigV4Auth(Credentials(key_id, secret), service, region).add_auth(request)
    return request


def _verify(
    request: AWSRequest, settings: Settings, *, body: bytes | None = None, now: dt.datetime | None = None
) -> str:
    headers = [(k.lower(), v) for k, v in request.headers.items()]
    if not any(k == "host" for k, _ in headers):
        headers.append(("host", "127.0.0.1:8080"))
    return verify_sigv4(
        method=request.method, raw_path="/", raw_query="", headers=headers,
        body=request.body if body is None else body, settings=settings, now=now,
    )  # fmt: skip


def _code(request: AWSRequest, settings: Settings, **kwargs) -> str:
    with pytest.raises(SigV4Error) as refused:
        _verify(request, settings, **kwargs)
    return refused.value.code


def _with_header(request: AWSRequest, name: str, value: str) -> AWSRequest:
    request.headers[name] = value
    return request


# -- the verifier, on requests signed by botocore --------------------------------------------------
def test_a_botocore_signature_verifies() -> None:
    assert _verify(_signed(b'{"MaxResults": 5}'), _settings()) == KEY_ID


def test_forgeries_are_refused() -> None:
    settings = _settings()
    genuine = _signed(b'{"TrainingJobName": "a"}')
    # The same signature over another body (a replay with a swapped request).
    assert _code(genuine, settings, body=b'{"TrainingJobName": "b"}') == "InvalidSignatureException"
    # Right key id, wrong secret.
    assert _code(_signed(secret="not-the-secret-0123456789"), settings) == "InvalidSignatureException"
    # An invented key id; a zero signature on a real key id.
    assert _code(_signed(key_id="ANYTHING0000"), settings) == "UnrecognizedClientException"
    zero = _signed()
    zero.headers.replace_header("Authorization", zero.headers["Authorization"].rsplit("=", 1)[0] + "=" + "0" * 64)
    assert _code(zero, settings) == "InvalidSignatureException"
    # Another operation under the same signature (X-Amz-Target is signed).
    swapped = _signed()
    del swapped.headers["X-Amz-Target"]
    swapped.headers["X-Amz-Target"] = "SageMaker.StopTrainingJob"
    assert _code(swapped, settings) == "InvalidSignatureException"
    # Wrong region, wrong service: refused even though correctly signed for them.
    assert _code(_signed(region="eu-west-1"), settings) == "InvalidSignatureException"
    assert _code(_signed(service="s3"), settings) == "InvalidSignatureException"
    # CloudWatch Logs operations (fit(logs=True)) are signed for "logs"; only they may be.
    assert _verify(_signed(service="logs", target="Logs_20140328.GetLogEvents"), settings) == KEY_ID
    assert _code(_signed(service="logs"), settings) == "InvalidSignatureException"
    assert _code(_signed(target="Logs_20140328.GetLogEvents"), settings) == "InvalidSignatureException"
    # An unsigned payload would let anyone replay the signature with another body.
    unsigned = _with_header(_signed(), "X-Amz-Content-SHA256", "UNSIGNED-PAYLOAD")
    assert _code(unsigned, settings) == "InvalidSignatureException"
    # Not SigV4 at all.
    basic = _signed()
    basic.headers.replace_header("Authorization", "Basic dXNlcjpwYXNz")
    assert _code(basic, settings) == "IncompleteSignatureException"


def test_the_date_must_be_within_fifteen_minutes() -> None:
    settings = _settings()
    request = _signed()
    signed_at = dt.datetime.strptime(request.headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.timezone.utc)
    assert _verify(request, settings, now=signed_at + dt.timedelta(minutes=14)) == KEY_ID  # replay inside the window
    assert _code(request, settings, now=signed_at + dt.timedelta(minutes=16)) == "InvalidSignatureException"
    assert _code(request, settings, now=signed_at - dt.timedelta(minutes=16)) == "InvalidSignatureException"
    # A date of 1999 in the header, re-signed by botocore itself at that date.
    request = AWSRequest(method="POST", url="http://127.0.0.1:8080/", data=b"{}", headers={"X-Amz-Target": TARGET})
    import botocore.auth

    original = botocore.auth.get_current_datetime
    botocore.auth.get_current_datetime = lambda: dt.datetime(1999, 1, 1)
    try:
        SigV4Auth(Credentials(KEY_ID, SECRET), "sagemaker", "us-east-1").add_auth(request)
    finally:
        botocore.auth.get_current_datetime = original
    assert _code(request, settings) == "InvalidSignatureException"


def test_host_date_and_target_must_be_signed() -> None:
    settings = _settings()
    request = _signed()
    authorization = request.headers["Authorization"].replace("x-amz-target;", "").replace(";x-amz-target", "")
    request.headers.replace_header("Authorization", authorization)
    assert _code(request, settings) == "IncompleteSignatureException"


def test_each_authorization_field_once_and_nothing_else() -> None:
    """A repeated field is refused, whichever copy is genuine: parsers that keep the first and the
    last copy would judge different signatures of one request."""
    settings = _settings()
    genuine = _signed()
    header = genuine.headers["Authorization"]
    algorithm, _, rest = header.partition(" ")
    fields = dict(part.strip().split("=", 1) for part in rest.split(","))
    forged_fields = {"Signature": "0" * 64, "Credential": f"ANYTHING0000/{fields['Credential'].split('/', 1)[1]}",
                     "SignedHeaders": "host;x-amz-date;x-amz-target"}  # fmt: skip
    for name, forged in forged_fields.items():
        for order in ((forged, fields[name]), (fields[name], forged)):
            request = _signed()
            extra = ", ".join(f"{name}={value}" for value in order)
            others = ", ".join(f"{k}={v}" for k, v in fields.items() if k != name)
            request.headers.replace_header("Authorization", f"{algorithm} {others}, {extra}")
            with pytest.raises(SigV4Error, match=f"{name}= is given more than once"):
                _verify(request, settings)
    for mangled in (f"{header}, Extra=1", header.replace("Signature=", "XSignature=", 1),
                    header.replace("Signature=", "Signature =", 1), f"{header},"):  # fmt: skip
        request = _signed()
        request.headers.replace_header("Authorization", mangled)
        assert _code(request, settings) == "IncompleteSignatureException"
    assert _verify(genuine, settings) == KEY_ID  # the genuine header still verifies


def test_two_authorization_headers_are_refused() -> None:
    request = _signed()
    headers = [(k.lower(), v) for k, v in request.headers.items()] + [("host", "127.0.0.1:8080")]
    headers.append(("authorization", request.headers["Authorization"]))
    with pytest.raises(SigV4Error, match="more than one Authorization"):
        verify_sigv4(method="POST", raw_path="/", raw_query="", headers=headers, body=request.body,
                     settings=_settings())  # fmt: skip


def test_native_requests_are_signed_for_the_trainguard_service() -> None:
    settings = _settings()
    request = AWSRequest(method="GET", url="http://127.0.0.1:8080/v1/jobs?status=InProgress", data=b"",
                         headers={"Host": "127.0.0.1:8080"})  # fmt: skip
    SigV4Auth(Credentials(KEY_ID, SECRET), "trainguard", "us-east-1").add_auth(request)
    parts = {"method": "GET", "raw_path": "/v1/jobs", "headers": [(k.lower(), v) for k, v in request.headers.items()],
             "body": b"", "settings": settings}  # fmt: skip
    assert verify_sigv4(raw_query="status=InProgress", service="trainguard", **parts) == KEY_ID
    with pytest.raises(SigV4Error):  # the query is signed
        verify_sigv4(raw_query="status=Completed", service="trainguard", **parts)
    with pytest.raises(SigV4Error, match="correct service"):  # a native signature is not a SageMaker one
        verify_sigv4(raw_query="status=InProgress", **parts)
    sagemaker = _signed()
    headers = [(k.lower(), v) for k, v in sagemaker.headers.items()] + [("host", "127.0.0.1:8080")]
    with pytest.raises(SigV4Error, match="correct service"):  # nor a SageMaker one a native one
        verify_sigv4(method="POST", raw_path="/", raw_query="", headers=headers, body=sagemaker.body,
                     settings=settings, service="trainguard")  # fmt: skip


# -- configuration --------------------------------------------------------------------------------
def test_any_signature_switch_is_gone() -> None:
    with pytest.raises(ConfigError, match="TRAINGUARD_SAGEMAKER_ALLOW_ANY_SIGNATURE"):
        _settings(TRAINGUARD_SAGEMAKER_ALLOW_ANY_SIGNATURE="1")


@pytest.mark.parametrize(
    "keys, why",
    [
        (f"{KEY_ID}", "both parts"),
        (f"{KEY_ID}:short", "shorter than 16"),
        (f"bad/id:{SECRET}", "access key id"),
        (f"{KEY_ID}:{SECRET},{KEY_ID}:{SECRET}x", "twice"),
        (f"{KEY_ID}:{TOKEN}", "TRAINGUARD_API_TOKEN"),
        (f"{TOKEN.replace('-', '_')}:{SECRET}", None),  # a key id unlike the token is fine
    ],
)
def test_bad_key_configuration_refuses_to_start(keys: str, why: str | None) -> None:
    if why is None:
        _settings(TRAINGUARD_SAGEMAKER_ACCESS_KEYS=keys)
        return
    with pytest.raises(ConfigError, match=why):
        _settings(TRAINGUARD_SAGEMAKER_ACCESS_KEYS=keys)


def test_keys_file_must_be_private_and_revocation_needs_no_restart(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# team keys\nalice={KEY_ID}:{SECRET}\nbob=AKIDBOB000000001:{SECRET}-bob\n")
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        AccessKeyStore(path=path)
    path.chmod(0o600)
    store = AccessKeyStore(path=path)
    assert store.lookup(KEY_ID).name == "alice" and store.lookup("AKIDBOB000000001").name == "bob"
    path.write_text(f"alice={KEY_ID}:{SECRET}\n")  # bob revoked
    os.utime(path, ns=(1, 1))  # a distinct stamp even within the filesystem's time resolution
    assert store.lookup("AKIDBOB000000001") is None and store.lookup(KEY_ID) is not None
    assert SECRET not in repr(store.lookup(KEY_ID))


# -- the running API, with real boto3 clients -----------------------------------------------------
def _raw_post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_endpoint_verifies_boto3_signatures_and_refuses_forgeries(api) -> None:
    import boto3

    assert api.sagemaker().list_training_jobs()["TrainingJobSummaries"] == []

    def client(key_id: str, secret: str, region: str = "us-east-1"):  # noqa: ANN202
        session = boto3.session.Session(aws_access_key_id=key_id, aws_secret_access_key=secret, region_name=region)
        return session.client("sagemaker", endpoint_url=api.url)

    for bad, code in (
        (client(SAGEMAKER_KEY_ID, "wrong-secret-0123456789"), "InvalidSignatureException"),
        (client("ANYTHING0000", "x" * 20), "UnrecognizedClientException"),
        (client(TOKEN, "anything"), "UnrecognizedClientException"),  # the API token is not a key id
        (client(SAGEMAKER_KEY_ID, SAGEMAKER_SECRET, "eu-west-1"), "InvalidSignatureException"),
    ):
        with pytest.raises(ClientError) as refused:
            bad.list_training_jobs()
        assert refused.value.response["Error"]["Code"] == code
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403

    # A genuine signed request: replayed as is it is accepted (as AWS does inside the window);
    # replayed with another body it is refused, and nothing is created.
    host = api.url.removeprefix("http://")
    body = json.dumps({"TrainingJobName": "never-created"}).encode()
    request = AWSRequest(
        method="POST", url=api.url + "/", data=body,
        headers={"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": "SageMaker.DescribeTrainingJob",
                 "Host": host},
    )  # fmt: skip
    SigV4Auth(Credentials(SAGEMAKER_KEY_ID, SAGEMAKER_SECRET), "sagemaker", "us-east-1").add_auth(request)
    headers = dict(request.headers.items())
    status, answer = _raw_post(api.url + "/", body, headers)
    assert answer["__type"] != "InvalidSignatureException" and status == 400  # ResourceNotFound: it got through
    forged_body = json.dumps({"TrainingJobName": "never-created", "x": 1}).encode()
    status, answer = _raw_post(api.url + "/", forged_body, headers)
    assert (status, answer["__type"]) == (403, "InvalidSignatureException")
    create = dict(headers, **{"X-Amz-Target": "SageMaker.CreateTrainingJob"})
    status, answer = _raw_post(api.url + "/", body, create)
    assert (status, answer["__type"]) == (403, "InvalidSignatureException")
    # The key id (in clear in every request) is not a bearer token on the native API.
    assert api.request("GET", "/v1/jobs", token=SAGEMAKER_KEY_ID)[0] == 401
    assert api.request("GET", "/v1/jobs", token=SAGEMAKER_SECRET)[0] == 401
    assert api.request("GET", "/v1/jobs")[0] == 200
    assert api.sagemaker().list_training_jobs()["TrainingJobSummaries"] == []


def test_state_is_private(api) -> None:
    mode = stat.S_IMODE(api.data_dir.stat().st_mode)
    # As root the local launcher lets its jobs' own users traverse the data dir (o+x), never list or read it.
    assert mode == (0o701 if os.geteuid() == 0 else 0o700), oct(mode)
    database = api.data_dir / "trainguard.db"
    assert database.is_file()
    assert stat.S_IMODE(database.stat().st_mode) == 0o600


def test_secure_state_makes_existing_state_private(tmp_path: Path) -> None:
    from trainguard.services.api.settings import secure_state

    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    (data / "trainguard.db").write_text("")
    (data / "trainguard.db-journal").write_text("")
    for path in (data / "trainguard.db", data / "trainguard.db-journal"):
        path.chmod(0o644)
    previous = os.umask(0o022)
    try:
        secure_state(_settings(TRAINGUARD_DATA_DIR=str(data)))
        assert os.umask(0o077) == 0o077  # what the API creates later is private too
    finally:
        os.umask(previous)
    # Group and others lose everything but others' traversal (o+x, kept for the local launcher's job users).
    assert stat.S_IMODE(data.stat().st_mode) == 0o701
    assert stat.S_IMODE((data / "trainguard.db").stat().st_mode) == 0o600
    assert stat.S_IMODE((data / "trainguard.db-journal").stat().st_mode) == 0o600


def test_keys_created_and_revoked_with_the_cli_take_effect_on_the_running_api(api_factory, tmp_path: Path) -> None:
    import subprocess
    import sys

    import boto3

    keys = tmp_path / "sagemaker-keys"

    def cli(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "trainguard.services.api.access_keys", "--file", str(keys), *args],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout

    cli("create", "ops")
    api = api_factory(TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE=str(keys))
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600
    pair = dict(line.split("=", 1) for line in cli("create", "ci-bot").split())
    assert "ci-bot\t" + pair["AWS_ACCESS_KEY_ID"] in cli("list") and pair["AWS_SECRET_ACCESS_KEY"] not in cli("list")
    client = boto3.session.Session(
        aws_access_key_id=pair["AWS_ACCESS_KEY_ID"], aws_secret_access_key=pair["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    ).client("sagemaker", endpoint_url=api.url)  # fmt: skip
    assert client.list_training_jobs()["TrainingJobSummaries"] == []  # no restart needed
    assert api.sagemaker().list_training_jobs()["TrainingJobSummaries"] == []  # the inline key still works
    cli("revoke", "ci-bot")
    with pytest.raises(ClientError) as refused:
        client.list_training_jobs()
    assert refused.value.response["Error"]["Code"] == "UnrecognizedClientException"
