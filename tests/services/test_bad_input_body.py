"""The body limit and authentication-before-the-body, on the real uvicorn server (raw sockets).

A client that announces 100 MB and sends nothing must get its 401/403 at once: the server may not
wait for (or buffer) a body it will refuse. An authenticated client over the limit gets 413,
whether it announces the length or streams chunks.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest

from tests.services.conftest import TOKEN

LIMIT = 64 * 1024


def _status_line(api: Any, head: str, body: bytes = b"", *, chunks: list[bytes] | None = None,
                 timeout: float = 10.0) -> tuple[int, str, float]:  # fmt: skip
    """Send a raw request; (status, response text, seconds until the answer began)."""
    host, port = "127.0.0.1", api.port
    started = time.monotonic()
    with socket.create_connection((host, port), timeout=timeout) as connection:
        connection.sendall(head.encode() + b"\r\n" + body)
        if chunks is not None:
            try:
                for chunk in chunks:
                    connection.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                connection.sendall(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered and closed before the whole body was sent: fine
        received = b""
        first = None
        while True:
            try:
                data = connection.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not data:
                break
            first = first or time.monotonic()
            received += data
            if b"\r\n\r\n" in received and b"content-length" in received.lower():
                head_part, _, rest = received.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head_part.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))  # fmt: skip
                if len(rest) >= length:
                    break
    text = received.decode(errors="replace")
    return int(text.split(" ", 2)[1]), text, (first or time.monotonic()) - started


def _head(method: str, path: str, headers: dict[str, str]) -> str:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"] + [f"{k}: {v}" for k, v in headers.items()]
    return "\r\n".join(lines) + "\r\n"


@pytest.fixture
def small_api(api_factory):  # noqa: ANN001, ANN201
    return api_factory(TRAINGUARD_MAX_BODY_BYTES=str(LIMIT))


def test_unauthenticated_big_body_is_refused_before_it_is_read(small_api) -> None:
    announced = {"Content-Type": "application/json", "Content-Length": str(100 * 1024 * 1024)}
    status, text, seconds = _status_line(small_api, _head("POST", "/v1/jobs", announced))
    assert status == 401 and "bearer" in text.lower(), text
    assert seconds < 5, seconds  # the server did not wait for 100 MB that never come
    status, text, _ = _status_line(
        small_api, _head("POST", "/", {**announced, "X-Amz-Target": "SageMaker.CreateTrainingJob"})
    )
    assert status == 403, text
    status, text, _ = _status_line(
        small_api,
        _head("POST", "/v1/internal/jobs/some-job/rules/R/status", {**announced, "Authorization": "Bearer wrong"}),
    )
    assert status == 401, text


def test_authenticated_body_over_the_limit_is_413_announced_or_streamed(small_api) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    status, text, seconds = _status_line(
        small_api, _head("POST", "/v1/jobs", {**auth, "Content-Length": str(LIMIT + 1)})
    )
    assert status == 413 and "TRAINGUARD_MAX_BODY_BYTES" in text, text
    assert seconds < 5
    # Chunked: no length announced; the server stops reading past the limit.
    big = json.dumps({"name": "big", "command": ["python"], "environment": {"A": "x" * (2 * LIMIT)}}).encode()
    pieces = [big[i : i + 8192] for i in range(0, len(big), 8192)]
    status, text, _ = _status_line(
        small_api, _head("POST", "/v1/jobs", {**auth, "Transfer-Encoding": "chunked"}), chunks=pieces
    )
    assert status == 413, text
    # SageMaker endpoint: the same limit, as an awsJson error.
    sagemaker = {**auth, "X-Amz-Target": "SageMaker.CreateTrainingJob", "Content-Type": "application/x-amz-json-1.1"}
    status, text, _ = _status_line(small_api, _head("POST", "/", {**sagemaker, "Content-Length": str(10 * LIMIT)}))
    assert status == 413 and "ValidationException" in text, text
    # Under the limit, chunked or not, the request goes through to validation as usual.
    small = json.dumps({"name": "small", "command": "not-a-list"}).encode()
    status, text, _ = _status_line(
        small_api, _head("POST", "/v1/jobs", {**auth, "Transfer-Encoding": "chunked"}), chunks=[small[:10], small[10:]]
    )
    assert status == 422 and "command" in text, text
    status, text, _ = _status_line(
        small_api, _head("POST", "/v1/jobs", {**auth, "Content-Length": str(len(small))}), small
    )
    assert status == 422 and "command" in text, text
    assert small_api.request("GET", "/v1/jobs")[1] == {"jobs": []}


def test_a_bad_limit_setting_stops_the_server_at_start(api_factory) -> None:
    with pytest.raises(AssertionError, match="TRAINGUARD_MAX_BODY_BYTES"):
        api_factory(TRAINGUARD_MAX_BODY_BYTES="lots")
