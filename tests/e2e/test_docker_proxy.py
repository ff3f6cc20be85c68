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


def _containers(engine) -> set[str]:  # noqa: ANN001
    """Containers these tests' specs would create (labelled tgproxy-*); other sessions' come and go.
    Sparse: listing without inspecting each, which races with containers removed meanwhile."""
    listed = engine.containers.list(all=True, sparse=True, filters={"label": JOB_LABEL})
    return {c.id for c in listed if str((c.attrs.get("Labels") or {}).get(JOB_LABEL, "")).startswith("tgproxy")}


def _volumes(engine) -> set[str]:  # noqa: ANN001
    return {v.name for v in engine.volumes.list() if v.name.startswith("tgproxy")}


def test_the_launcher_works_through_the_proxy(engine, proxied) -> None:  # noqa: ANN001
    name = f"tgproxy-{uuid.uuid4().hex[:8]}"
    launcher = DockerLauncher(proxied, user="10001:10001")  # the base image's default user is root
    job = JobLaunch(
        name,
        (
            ComponentSpec(
                "training",
                BASE_IMAGE,
                ("bash", "-c", "echo hello via proxy; id -u; sleep 30"),
                cpus=0.25,
                memory_mb=64,
                volumes={f"tg-{name}-tensors": "/opt/ml/output/tensors"},
            ),
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
        # ... and every other field the launcher sets, as rebuilt by the proxy
        assert attrs["Binds"] == [f"tg-{name}-tensors:/opt/ml/output/tensors:rw"] and attrs["Init"] is True
        assert attrs["PidsLimit"] == 4096 and attrs["NanoCpus"] == 250_000_000 and attrs["Memory"] == 64 << 20
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
        (
            {"Devices": [{"PathOnHost": "/dev/sda", "PathInContainer": "/dev/sda", "CgroupPermissions": "rwm"}]},
            "Devices",
        ),
        ({"SecurityOpt": ["no-new-privileges", "seccomp=unconfined"]}, "unconfined"),
        ({"SecurityOpt": []}, "no-new-privileges"),
        ({"CapDrop": []}, "CapDrop must include ALL"),
    ],
)
def test_dangerous_containers_are_refused(engine, proxy_url, host_config, why) -> None:  # noqa: ANN001
    before = _containers(engine)
    status, answer = _raw(proxy_url, "POST", "/v1.41/containers/create", _spec(**host_config))
    assert status == 403, answer
    assert why in answer["message"]
    assert _containers(engine) == before  # nothing was created


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
        assert outsider.id not in {c.id for c in proxied.containers.list(all=True, sparse=True)}  # narrowed
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


def test_a_container_mounts_only_its_own_jobs_volumes(engine, proxy_url) -> None:  # noqa: ANN001
    victim = f"tgproxy-victim-{uuid.uuid4().hex[:6]}"
    volume = engine.volumes.create(name=f"tgproxy-{uuid.uuid4().hex[:6]}", driver="local", labels={JOB_LABEL: victim})
    try:
        containers = _containers(engine)
        for host_config in ({"Binds": [f"{volume.name}:/stolen"]},
                            {"Mounts": [{"Type": "volume", "Source": volume.name, "Target": "/stolen"}]}):
            status, answer = _raw(proxy_url, "POST", "/v1.41/containers/create", _spec(**host_config))
            assert status == 403 and victim in str(answer), (host_config, status, answer)
        assert _containers(engine) == containers
        # The volume's own job may mount it.
        own = {**_spec(Binds=[f"{volume.name}:/tensors"]), "Labels": {JOB_LABEL: victim}}
        status, answer = _raw(proxy_url, "POST", "/v1.41/containers/create", own)
        assert status == 201, answer
        engine.containers.get(answer["Id"]).remove(force=True)
    finally:
        volume.remove(force=True)


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


# -- what the engine would do, not what the request spells (issue 44) -------------------------------
def _raw_bytes(proxy_url: str, method: str, path: str, body: bytes) -> tuple[int, str]:
    import http.client

    host, port = proxy_url.removeprefix("tcp://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        connection.close()


@pytest.fixture
def bind_volume(engine):  # noqa: ANN001, ANN201
    """A labelled volume whose driver options bind the host's /: made on the engine directly, as one
    could have been made through the proxy before it refused driver options."""
    volume = engine.volumes.create(name=f"tgproxy-bind-{uuid.uuid4().hex[:6]}", driver="local",
                                   driver_opts={"type": "none", "o": "bind", "device": "/"},
                                   labels={JOB_LABEL: "tgproxy"})  # fmt: skip
    yield volume.name
    volume.remove(force=True)


def _observed_requests(bind_volume: str) -> list[tuple[str, str, bytes]]:
    """The crafted requests of issue 44 (item 1 of the observations) and their neighbours."""
    requests = []
    for user in ("00", "0000", "+0", "-0", "0000:0000", "0:0", "root", ":10001", "10001:0", "-00:+0"):
        spec = _spec()
        spec["User"] = user
        requests.append(("POST", "/v1.41/containers/create", json.dumps(spec).encode()))
    opts = {"type": "none", "o": "bind", "device": "/"}
    requests.append(("POST", "/v1.41/volumes/create", json.dumps(
        {"Name": f"tgproxy-{uuid.uuid4().hex[:6]}", "Driver": "local", "DriverOpts": opts, "Labels": {JOB_LABEL: "x"}}
    ).encode()))  # fmt: skip
    requests.append(("POST", "/v1.41/volumes/create", json.dumps(
        {"Name": f"tgproxy-{uuid.uuid4().hex[:6]}", "DriverOpt\u017f": opts, "Labels": {JOB_LABEL: "x"}}
    ).encode()))  # fmt: skip
    requests.append(("POST", "/v1.41/containers/create", json.dumps(_spec(Binds=[f"{bind_volume}:/host"])).encode()))
    requests.append(("POST", "/v1.41/containers/create", json.dumps(_spec(
        Mounts=[{"Type": "volume", "Source": bind_volume, "Target": "/host"}])).encode()))  # fmt: skip
    requests.append(("POST", "/v1.41/containers/create", json.dumps(_spec(Mounts=[{
        "Type": "volume", "Source": f"tgproxy-{uuid.uuid4().hex[:6]}", "Target": "/host",
        "VolumeOptions": {"DriverConfig": {"Name": "local", "Options": opts}}}])).encode()))  # fmt: skip
    for key, value in (("Bind\u017f", ["/:/host"]), ("Device\u017f", [{"PathOnHost": "/dev/sda",
                       "PathInContainer": "/dev/sda", "CgroupPermissions": "rwm"}]),
                       ("NetworKMode", "host"), ("Privileged", True), ("privileged", True), ("CapAdd", ["ALL"]),
                       ("Capabilities", ["CAP_SYS_ADMIN"]), ("\u017fecurityOpt", ["no-new-privileges"]),
                       ("VolumeDriver", "local"), ("GroupAdd", ["0"]), ("MaskedPaths", [])):  # fmt: skip
        requests.append(("POST", "/v1.41/containers/create", json.dumps(_spec(**{key: value})).encode()))
    spec = _spec()
    spec["U\u017fer"] = "0"  # Go reads it as User, next to the judged one
    requests.append(("POST", "/v1.41/containers/create", json.dumps(spec).encode()))
    spec = _spec()
    del spec["User"]
    spec["U\u017fer"] = "0"
    requests.append(("POST", "/v1.41/containers/create", json.dumps(spec).encode()))
    for body in (b"[]", b"null", b'"x"', b'{"Image": NaN}'):
        requests.append(("POST", "/v1.41/containers/create", body))
    requests.append(("POST", "/v1.40/containers/create", json.dumps(_spec()).encode()))
    requests.append(("POST", "/v1.41/containers/create?platform=linux/arm64", json.dumps(_spec()).encode()))
    return requests


def test_the_observed_requests_are_all_refused(engine, proxy_url, bind_volume) -> None:  # noqa: ANN001
    requests = _observed_requests(bind_volume)
    containers, volumes = _containers(engine), _volumes(engine)
    accepted = []
    for method, path, body in requests:
        status, answer = _raw_bytes(proxy_url, method, path, body)
        if status < 400:
            accepted.append((path, body, status, answer))
    print(f"{len(accepted)} of {len(requests)} crafted requests accepted")
    assert accepted == []
    assert _containers(engine) == containers and _volumes(engine) == volumes


def test_a_host_config_given_to_start_under_an_old_api_version_is_refused(engine, proxy_url) -> None:  # noqa: ANN001
    # API < 1.24 applies a HostConfig sent with start: the host's / bound into a job container
    status, answer = _raw(proxy_url, "POST", "/v1.41/containers/create", _spec())
    assert status == 201, answer
    container = answer["Id"]
    try:
        for path in (f"/v1.23/containers/{container}/start", f"/v1.41/containers/{container}/start"):
            status, _ = _raw(proxy_url, "POST", path, {"Binds": ["/:/host"], "Privileged": True})
            assert status in (400, 403), path
        attrs = engine.containers.get(container).attrs
        assert attrs["State"]["Status"] == "created" and not attrs["HostConfig"]["Binds"]
    finally:
        engine.containers.get(container).remove(force=True)


def test_smuggled_and_pipelined_requests_reach_nothing(engine, proxy_url) -> None:  # noqa: ANN001
    import socket

    host, port = proxy_url.removeprefix("tcp://").split(":")
    inner = json.dumps(_spec(Binds=["/:/host"])).encode()
    smuggled = (b"POST /v1.41/containers/create HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(inner), inner))  # fmt: skip
    containers = _containers(engine)
    for raw in (
        b"POST /v1.41/containers/create HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n"
        b"\r\n0\r\n\r\n" + smuggled,
        b"GET /_ping HTTP/1.1\r\nHost: x\r\n\r\n" + smuggled,
        b"POST /v1.41/containers/create HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: %d\r\n\r\n{}%s"
        % (len(smuggled) + 2, smuggled),
    ):  # fmt: skip
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            connection.sendall(raw)
            connection.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
        assert b"HTTP/1.1 201" not in answer, answer
    assert _containers(engine) == containers


def test_path_and_query_tricks_are_refused(engine, proxy_url) -> None:  # noqa: ANN001
    outsider = engine.containers.create(BASE_IMAGE, ["sleep", "30"], name=f"not-trainguard-{uuid.uuid4().hex[:6]}")
    try:
        for method, path in (
            ("GET", "/v1.41/containers/../../info"),
            ("GET", "/v1.41/containers/%2e%2e/%2e%2e/info"),
            ("GET", f"/v1.41/containers/{outsider.id}%2Fjson"),
            ("GET", "/v1.41/containers/json?filters=%7B%22label%22%3A%5B%5D%2C%22label%22%3A%5B%5D%7D"),
            ("GET", "/v1.41/containers/json?all=1;filters=x"),
            ("GET", f"/v1.41/containers/json?since={outsider.id}"),
            ("DELETE", f"/v1.41/containers/{outsider.id}?force=1"),
            ("DELETE", f"/v1.41/containers/{outsider.id[:12]}?force=1"),
            ("GET", "/v1.12/containers/json"),
        ):
            status, answer = _raw(proxy_url, method, path)
            assert status >= 400, (method, path, answer)
        # http.server folds leading slashes; what is judged (a narrowed listing) is what is forwarded
        status, answer = _raw(proxy_url, "GET", "//containers/json?all=1")
        assert status == 200 and outsider.id not in {c["Id"] for c in answer}
        assert engine.containers.get(outsider.id).status == "created"
    finally:
        outsider.remove(force=True)


def test_a_numeric_user_in_any_spelling_runs_as_that_number(engine, proxy_url) -> None:  # noqa: ANN001
    spec = _spec()
    spec["User"], spec["Cmd"] = "+010001:0010001", ["sh", "-c", "id -u; id -g"]
    status, answer = _raw(proxy_url, "POST", "/v1.41/containers/create", spec)
    assert status == 201, answer
    container = engine.containers.get(answer["Id"])
    try:
        assert container.attrs["Config"]["User"] == "10001:10001"  # forwarded canonically
        container.start()
        container.wait(timeout=30)
        assert container.logs().decode().split() == ["10001", "10001"]
    finally:
        container.remove(force=True)


# -- a fuzz of spellings against the engine -----------------------------------------------------------
_HOST_DANGERS = {
    "Binds": ["/:/host"], "Devices": [{"PathOnHost": "/dev/sda", "PathInContainer": "/dev/sda",
                                       "CgroupPermissions": "rwm"}],
    "Privileged": True, "CapAdd": ["SYS_ADMIN"], "NetworkMode": "host", "PidMode": "host", "UsernsMode": "host",
    "Mounts": [{"Type": "bind", "Source": "/", "Target": "/host"}], "SecurityOpt": ["seccomp=unconfined"],
    "VolumesFrom": ["x"], "Sysctls": {"kernel.shm_rmid_forced": "1"}, "Links": ["x:y"],
}  # fmt: skip


def _spellings(name: str):  # noqa: ANN202 - a hypothesis strategy
    from hypothesis import strategies as st

    def variants(char: str) -> list[str]:
        extra = {"s": ["\u017f"], "k": ["\u212a"], "i": ["\u0130", "\u0131"]}.get(char.lower(), [])
        fullwidth = [chr(0xFF00 + ord(char) - 0x20)] if char.isascii() and char.isalpha() else []
        return [char, char.swapcase(), *extra, *fullwidth]

    return st.tuples(*(st.sampled_from(variants(char)) for char in name)).map("".join)


def test_fuzzed_key_spellings_and_users_are_refused_by_the_proxy_in_front_of_the_engine(engine, proxy_url) -> None:  # noqa: ANN001
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    containers = _containers(engine)
    tried: list[int] = []

    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(data=st.data(), name=st.sampled_from(sorted(_HOST_DANGERS)))
    def host_fields(data, name: str) -> None:  # noqa: ANN001
        key = data.draw(_spellings(name))
        status, answer = _raw(proxy_url, "POST", "/v1.41/containers/create", _spec(**{key: _HOST_DANGERS[name]}))
        tried.append(status)
        assert status >= 400, (key, answer)

    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(key=_spellings("User"), zeros=st.from_regex(r"[+-]?0{1,6}", fullmatch=True),
           group=st.sampled_from(["", ":0", ":00", ":+0", ":10001", ":root", ":"]))  # fmt: skip
    def root_users(key: str, zeros: str, group: str) -> None:
        spec = _spec()
        if key != "User":
            del spec["User"]  # the base image's default user is root: only the fuzzed key could say otherwise
        spec[key] = zeros + group
        status, answer = _raw(proxy_url, "POST", "/v1.41/containers/create", spec)
        tried.append(status)
        assert status >= 400, (key, zeros + group, answer)

    host_fields()
    root_users()
    print(f"0 of {len(tried)} fuzzed requests accepted; statuses {sorted(set(tried))}")
    assert len(tried) >= 200
    assert _containers(engine) == containers


def test_the_stacks_launch_works_through_a_proxy_limited_to_the_jobs_network(engine) -> None:  # noqa: ANN001
    """As in the compose stack: a jobs network, no TRAINGUARD_JOB_USER (the image's USER is judged and
    written in), an uploader with a restart policy."""
    import docker

    from tests.e2e.docker_env import SERVICE_IMAGE

    try:
        engine.images.get(SERVICE_IMAGE)
    except Exception:  # noqa: BLE001 - the image is built by infra/build_images.sh
        pytest.skip(f"{SERVICE_IMAGE} is not built")
    network = engine.networks.create(f"tgproxy-net-{uuid.uuid4().hex[:6]}")
    server = DockerProxy(("127.0.0.1", 0), "/var/run/docker.sock", ProxyPolicy(allowed_networks=(network.name,)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = docker.DockerClient(base_url=f"tcp://127.0.0.1:{server.server_address[1]}", timeout=60)
    name = f"tgproxy-{uuid.uuid4().hex[:8]}"
    launcher = DockerLauncher(client, network=network.name)
    command = ("sh", "-c", "echo uid=$(id -u):$(id -g); sleep 30")
    job = JobLaunch(name, (
        ComponentSpec("training", SERVICE_IMAGE, command, cpus=0.25, memory_mb=64, working_dir="/tmp",
                      volumes={f"tg-{name}-tensors": "/opt/ml/output/tensors"}, environment={"A": "b"}),
        ComponentSpec("uploader", SERVICE_IMAGE, command, volumes={f"tg-{name}-tensors": "/opt/ml/output/tensors"}),
    ))  # fmt: skip
    try:
        launcher.start(job)
        deadline = time.monotonic() + 30
        while not all("uid=" in launcher.logs(name, role) for role in ("training", "uploader")):
            assert time.monotonic() < deadline, launcher.logs(name)
            time.sleep(0.2)
        assert "uid=10001:10001" in launcher.logs(name, "training")
        containers = engine.containers.list(filters={"label": f"{JOB_LABEL}={name}"})
        assert {c.attrs["Config"]["User"] for c in containers} == {"10001:10001"}  # written in by the proxy
        assert {c.attrs["HostConfig"]["NetworkMode"] for c in containers} == {network.name}
        uploader = next(c for c in containers if c.name.endswith("uploader"))
        assert uploader.attrs["HostConfig"]["RestartPolicy"] == {"Name": "on-failure", "MaximumRetryCount": 5}
        launcher.stop(name, grace_seconds=1)
    finally:
        launcher.remove(name)
        client.close()
        server.shutdown()
        server.server_close()
        network.remove()


@pytest.mark.parametrize(
    "field, key",
    [
        ("WorkingDir", "WorkingDir"), ("WorkingDir", "workingdir"), ("WorkingDir", "WORKINGDIR"),
        ("WorkingDir", "Wor\u212aingDir"), ("WorkingDir", "Work\u0131ngDir"), ("WorkingDir", "Work\u0130ngDir"),
        ("WorkingDir", "\uff37orkingDir"), ("WorkingDir", "Working\u200bDir"), ("Hostname", "Ho\u017ftname"),
        ("Hostname", "HOSTNAME"), ("Hostname", "Ho\u0455tname"), ("Hostname", "Hostnam\u0435"),
    ],
)  # fmt: skip
def test_the_engine_folds_keys_exactly_as_the_proxy_models_it(engine, field: str, key: str) -> None:  # noqa: ANN001
    """Straight to the engine (no proxy): a key reaches a field iff go_fold says it does."""
    from trainguard.services.docker_proxy.gojson import go_fold
    from trainguard.services.docker_proxy.server import UnixHTTPConnection

    value = {"WorkingDir": "/probe", "Hostname": "probe"}[field]
    body = {"Image": BASE_IMAGE, "Cmd": ["true"], "Labels": {"tgproxy-probe": "1"}, key: value}
    connection = UnixHTTPConnection("/var/run/docker.sock", timeout=30)
    try:
        connection.request("POST", "/v1.41/containers/create", body=json.dumps(body).encode(),
                           headers={"Content-Type": "application/json"})  # fmt: skip
        created = connection.getresponse()
        answer = json.loads(created.read())
    finally:
        connection.close()
    assert created.status == 201, answer
    container = engine.containers.get(answer["Id"])
    try:
        applied = container.attrs["Config"][field] == value
    finally:
        container.remove(force=True)
    assert applied == (go_fold(key) == go_fold(field)), (key, applied)
