"""The restricting Docker API proxy against the real engine.

The proxy runs in this process on a loopback port, forwarding to the real socket; the Docker SDK
talks to it as it would to the engine. What the launcher needs works through it; a container with
the host's ``/`` mounted, a privileged one, host namespaces, added capabilities, devices, an
unlabelled container and operations on containers that are not trainguard's are refused.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from trainguard.services.docker_proxy.rules import ProxyPolicy
from trainguard.services.docker_proxy.server import DockerProxy
from trainguard.services.launchers.base import ComponentSpec, ComponentState, JobLaunch
from trainguard.services.launchers.docker import JOB_LABEL, DockerLauncher

from tests.e2e.docker_env import BASE_IMAGE, docker_client, require_image


@pytest.fixture(scope="module")
def engine():  # noqa: ANN201
    client = docker_client()
    require_image(client, BASE_IMAGE, "infra/build_base_image.sh")
    yield client
    client.close()


@pytest.fixture(scope="module")
def proxy_url(engine):  # noqa: ANN001, ANN201
    server = DockerProxy(("127.0.0.1", 0), "/var/run/docker.sock", ProxyPolicy())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"tcp://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxied(proxy_url):  # noqa: ANN001, ANN201
    import docker

    client = docker.DockerClient(base_url=proxy_url, timeout=60)
    yield client
    client.close()


def _raw(proxy_url: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict | str]:
    import http.client

    host, port = proxy_url.removeprefix("tcp://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        data = json.dumps(body).encode() if body is not None else None
        connection.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        raw = response.read()
    finally:
        connection.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw.decode(errors="replace")


def _spec(**host_config) -> dict:
    """A container spec as the launcher makes it, with HostConfig overrides."""
    return {
        "Image": BASE_IMAGE,
        "Cmd": ["true"],
        "User": "10001:10001",
        "Labels": {JOB_LABEL: f"tgproxy-{uuid.uuid4().hex[:6]}"},
        "HostConfig": {"CapDrop": ["ALL"], "SecurityOpt": ["no-new-privileges"], **host_config},
    }


def test_the_launcher_works_through_the_proxy(engine, proxied) -> None:  # noqa: ANN001
    name = f"tgproxy-{uuid.uuid4().hex[:8]}"
    launcher = DockerLauncher(proxied, user="10001:10001")  # the base image's default user is root
    job = JobLaunch(
        name,
        (
            ComponentSpec("training", BASE_IMAGE, ("bash", "-c", "echo hello via proxy; id -u; sleep 30"),
                          cpus=0.25, memory_mb=64, volumes={f"tg-{name}-tensors": "/opt/ml/output/tensors"}),
        ),  # fmt: skip
    )
    try:
        launcher.start(job)
        deadline = time.monotonic() + 30
        while "hello via proxy" not in launcher.logs(name) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "hello via proxy" in launcher.logs(name)
        assert launcher.status(name)["training"].state == ComponentState.RUNNING
        assert name in launcher.jobs()
        # The container really got the least-privilege options (inspected on the engine itself).
        attrs = engine.containers.list(filters={"label": f"{JOB_LABEL}={name}"})[0].attrs["HostConfig"]
        assert attrs["CapDrop"] == ["ALL"] and "no-new-privileges" in attrs["SecurityOpt"]
        assert "\n10001\n" in launcher.logs(name)  # id -u
        launcher.stop(name, grace_seconds=1)
        assert launcher.status(name)["training"].state == ComponentState.EXITED
    finally:
        launcher.remove(name)
    assert launcher.status(name) == {}
    assert not engine.volumes.list(filters={"label": f"{JOB_LABEL}={name}"})


@pytest.mark.parametrize(
    "host_config, why",
    [
        ({"Binds": ["/:/host"]}, "bind mount of host path '/'"),
        ({"Binds": ["/var/run/docker.sock:/var/run/docker.sock"]}, "bind mount"),
        ({"Mounts": [{"Type": "bind", "Source": "/", "Target": "/host"}]}, "bind mount"),
        ({"Privileged": True}, "privileged"),
        ({"CapAdd": ["SYS_ADMIN"]}, "CapAdd"),
        ({"NetworkMode": "host"}, "NetworkMode"),
        ({"PidMode": "host"}, "PidMode"),
        ({"IpcMode": "host"}, "IpcMode"),
        ({"UsernsMode": "host"}, "UsernsMode"),
        ({"Devices": [{"PathOnHost": "/dev/sda", "PathInContainer": "/dev/sda", "CgroupPermissions": "rwm"}]},
         "Devices"),
        ({"SecurityOpt": ["no-new-privileges", "seccomp=unconfined"]}, "unconfined"),
        ({"SecurityOpt": []}, "no-new-privileges"),
        ({"CapDrop": []}, "CapDrop must include ALL"),
    ],
)
def test_dangerous_containers_are_refused(engine, proxy_url, host_config, why) -> None:  # noqa: ANN001
    before = {c.id for c in engine.containers.list(all=True)}
    status, answer = _raw(proxy_url, "POST", "/v1.41/containers/create", _spec(**host_config))
    assert status == 403, answer
    assert why in answer["message"]
    assert {c.id for c in engine.containers.list(all=True)} == before  # nothing was created


def test_case_and_duplicate_tricks_are_refused(engine, proxy_url) -> None:  # noqa: ANN001
    # dockerd matches JSON field names ignoring case: "privileged" is Privileged to it.
    spec = _spec()
    spec["HostConfig"]["privileged"] = True
    assert _raw(proxy_url, "POST", "/containers/create", spec)[0] == 403
    spec = _spec()
    spec["hostconfig"] = {"Binds": ["/:/host"]}  # a second HostConfig under another case
    status, answer = _raw(proxy_url, "POST", "/containers/create", spec)
    assert status == 403 and "twice" in answer["message"]
    unlabelled = _spec()
    unlabelled["Labels"] = {}
    assert _raw(proxy_url, "POST", "/containers/create", unlabelled)[0] == 403


def test_other_containers_and_operations_are_out_of_reach(engine, proxy_url, proxied) -> None:  # noqa: ANN001
    import docker.errors

    outsider = engine.containers.create(BASE_IMAGE, ["sleep", "30"], name=f"not-trainguard-{uuid.uuid4().hex[:6]}")
    try:
        assert outsider.id not in {c.id for c in proxied.containers.list(all=True)}  # listings are narrowed
        for method, path in (
            ("GET", f"/containers/{outsider.id}/json"),
            ("POST", f"/containers/{outsider.id}/start"),
            ("DELETE", f"/containers/{outsider.id}?force=1"),
            ("POST", f"/containers/{outsider.id}/exec"),
            ("POST", f"/containers/{outsider.id}/attach"),
            ("POST", "/images/create?fromImage=alpine"),
            ("POST", "/build"),
            ("GET", "/info"),
            ("POST", "/networks/create"),
            ("GET", "/secrets"),
        ):
            status, answer = _raw(proxy_url, method, path, {} if method == "POST" else None)
            assert status == 403, (method, path, answer)
        with pytest.raises(docker.errors.APIError):
            proxied.containers.get(outsider.id)
        assert engine.containers.get(outsider.id).status == "created"  # untouched
        # A missing container is a 404, as from the engine (the launcher relies on NotFound).
        with pytest.raises(docker.errors.NotFound):
            proxied.containers.get("tg-no-such-container")
    finally:
        outsider.remove(force=True)


def test_root_containers_are_refused(engine, proxy_url) -> None:  # noqa: ANN001
    for user in ("", "root", "0", "0:0", "root:root"):
        spec = _spec()
        spec["User"] = user  # "": the base image's default user, which is root
        status, answer = _raw(proxy_url, "POST", "/containers/create", spec)
        assert status == 403 and "root" in answer["message"], (user, answer)
    from tests.e2e.docker_env import SERVICE_IMAGE

    try:
        engine.images.get(SERVICE_IMAGE)
    except Exception:  # noqa: BLE001 - the image is built by infra/build_images.sh
        pytest.skip(f"{SERVICE_IMAGE} is not built")
    spec = _spec()
    spec["User"], spec["Image"] = "", SERVICE_IMAGE  # its USER is 10001: allowed without one here
    status, answer = _raw(proxy_url, "POST", "/containers/create", spec)
    assert status == 201, answer
    engine.containers.get(answer["Id"]).remove(force=True)
