"""The compose stack's S3 healthcheck must cost the same however much the endpoint holds.

It used to fetch moto's /moto-api/data.json, a dump of every stored object: 1.9 s at 5,000
objects on an idle machine, over the check's 2 s timeout under load, so after a dozen jobs the s3
service turned unhealthy and `docker compose restart api` (depends_on: service_healthy) failed
(bench/chaos_stack.py, restart-api, run 13 of 25). Real moto server, real objects.
"""

from __future__ import annotations

import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tests.reliability.faults import RestartableS3
from tests.s3_server import DUMMY_CREDENTIALS

REPO = Path(__file__).resolve().parents[2]


def _s3_healthcheck_path() -> str:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    command = " ".join(compose["services"]["s3"]["healthcheck"]["test"])
    match = re.search(r"http://127\.0\.0\.1:5000(/[^'\"]*)", command)
    assert match, command
    return match.group(1)


def test_s3_healthcheck_stays_cheap_with_thousands_of_objects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _s3_healthcheck_path()
    assert path.startswith("/moto-api/"), "admin routes answer the container itself only: the check runs inside"
    for name, value in {**DUMMY_CREDENTIALS, "NO_PROXY": "127.0.0.1,localhost"}.items():
        monkeypatch.setenv(name, value)
    server = RestartableS3(tmp_path / "moto.log")
    server.start()
    try:
        client = server.client()
        client.create_bucket(Bucket="runs")
        with ThreadPoolExecutor(8) as pool:  # 3,000 objects of 3 KB: about 7 e2e jobs' worth
            list(pool.map(lambda i: client.put_object(Bucket="runs", Key=f"job/{i}", Body=b"x" * 3000), range(3000)))
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        timings = []
        for _ in range(3):
            started = time.monotonic()
            with opener.open(server.endpoint + path, timeout=10) as response:
                assert response.status == 200
                size = len(response.read())
            timings.append(time.monotonic() - started)
        # data.json: 1.4-1.8 s and 3.5 MB here (measured); the dashboard: a few ms and ~10 KB
        assert size < 100_000 and min(timings) < 0.3, (size, timings)
    finally:
        server.kill()
