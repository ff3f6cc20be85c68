"""The Docker proxy's parsing, without an engine: Go's key folding, users as the runtime reads them,
the allow-list rebuild of container and volume creates, query strings, API versions, and (through
the real HTTP server, with a recording stand-in engine on a Unix socket) the framing of what is
forwarded. The same requests against the real engine are tests/e2e/test_docker_proxy.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trainguard.services.docker_proxy.gojson import decode_json, decode_object, fields_of, go_fold
from trainguard.services.docker_proxy.rules import JOB_LABEL, BadRequest, ProxyPolicy, Refused
from trainguard.services.docker_proxy.server import DockerProxy
from trainguard.services.docker_proxy.users import parse_user

# What docker-py 7 sends for DockerLauncher._run (captured from the SDK).
LAUNCHER_SPEC: dict[str, Any] = {
    "User": "10001:10001", "Tty": False, "OpenStdin": False, "StdinOnce": False, "AttachStdin": False,
    "AttachStdout": True, "AttachStderr": True, "Env": ["A=b"], "Cmd": ["bash", "-c", "x"], "Image": "img:local",
    "Volumes": {"/opt/ml/output/tensors": {}}, "NetworkDisabled": False, "WorkingDir": "/opt/ml/code",
    "HostConfig": {"Memory": 67108864, "NetworkMode": "trainguard-net", "CapDrop": ["ALL"],
                   "SecurityOpt": ["no-new-privileges"], "Binds": ["tg-j1-tensors:/opt/ml/output/tensors:rw"],
                   "CpuShares": 2, "PidsLimit": 4096, "Init": True, "NanoCpus": 250000000,
                   "RestartPolicy": {"Name": "on-failure", "MaximumRetryCount": 5}},
    "NetworkingConfig": {"trainguard-net": None},
    "Labels": {JOB_LABEL: "j1", "trainguard.role": "training"},
}  # fmt: skip
# Field names a body may hold at each level, to check that only these are ever forwarded.
FORWARDED_NAMES = {
    "Hostname", "Domainname", "User", "Env", "Cmd", "Entrypoint", "WorkingDir", "Image", "Labels", "Volumes",
    "StopSignal", "StopTimeout", "AttachStdin", "AttachStdout", "AttachStderr", "Tty", "OpenStdin", "StdinOnce",
    "NetworkDisabled", "HostConfig", "NetworkingConfig", "Binds", "Mounts", "NetworkMode", "RestartPolicy",
    "CapDrop", "SecurityOpt", "AutoRemove", "Init", "ReadonlyRootfs", "Memory", "MemorySwap", "MemoryReservation",
    "NanoCpus", "CpuShares", "CpuPeriod", "CpuQuota", "PidsLimit", "ShmSize", "Name", "MaximumRetryCount",
    "EndpointsConfig", "Aliases", "Type", "Source", "Target", "ReadOnly", "TmpfsOptions", "SizeBytes", "Mode",
}  # fmt: skip
# Fields the engine reads and the proxy must never let through, with a value that would do harm.
DANGEROUS_HOST_FIELDS = {
    "Binds": ["/:/host"], "Devices": [{"PathOnHost": "/dev/sda", "PathInContainer": "/dev/sda"}],
    "Privileged": True, "CapAdd": ["SYS_ADMIN"], "Capabilities": ["CAP_SYS_ADMIN"],
    "SecurityOpt": ["seccomp=unconfined"],
    "NetworkMode": "host", "PidMode": "host", "IpcMode": "host", "UsernsMode": "host", "UTSMode": "host",
    "CgroupnsMode": "host", "Sysctls": {"kernel.core_pattern": "|/x"}, "VolumesFrom": ["other"],
    "DeviceRequests": [{"Count": -1}], "DeviceCgroupRules": ["a *:* rwm"], "Runtime": "sysbox",
    "Mounts": [{"Type": "bind", "Source": "/", "Target": "/h"}], "VolumeDriver": "x", "GroupAdd": ["0"],
    "MaskedPaths": [], "ReadonlyPaths": [], "Links": ["other:o"], "OomScoreAdj": -1000,
    "PortBindings": {"22/tcp": [{"HostPort": "22"}]}, "LogConfig": {"Type": "syslog"}, "CgroupParent": "/",
}  # fmt: skip


def _body(spec: dict[str, Any]) -> bytes:
    return json.dumps(spec).encode()


def _create(spec: dict[str, Any], policy: ProxyPolicy | None = None):  # noqa: ANN202 - a Route
    return (policy or ProxyPolicy(allowed_networks=("trainguard-net",))).route(
        "POST", "/v1.41/containers/create", "name=tg-j1-training", _body(spec)
    )


def _with_host(**fields: Any) -> dict[str, Any]:
    spec = json.loads(json.dumps(LAUNCHER_SPEC))
    spec["HostConfig"].update(fields)
    return spec


def _names(value: Any, found: set[str]) -> set[str]:
    """Every object key of a forwarded body except map keys (labels, volume targets, networks)."""
    if isinstance(value, dict):
        for key, member in value.items():
            found.add(key)
            if key not in ("Labels", "Volumes", "EndpointsConfig"):
                _names(member, found)
            elif key == "EndpointsConfig":
                for settings_ in member.values():
                    _names(settings_, found)
    elif isinstance(value, list):
        for item in value:
            _names(item, found)
    return found


# -- Go's folding ----------------------------------------------------------------------------------
def test_go_fold_folds_ascii_letters_long_s_and_kelvin_only() -> None:
    assert go_fold("binds") == go_fold("BINDS") == go_fold("Bind\u017f") == "BINDS"
    assert go_fold("networ\u212amode") == "NETWORKMODE"
    for other in ("\u0130mage", "\u0131mage", "\uff22inds", "Binds\u200d", "B\u0131nds", "Pr\u0130vileged"):
        assert go_fold(other) is None, other  # İ, ı, fullwidth, ZWJ: Go maps them onto no ASCII field


def test_the_launchers_own_request_is_accepted_and_rebuilt() -> None:
    route = _create(LAUNCHER_SPEC)
    assert route.path == "/v1.41/containers/create?name=tg-j1-training"
    plan = route.container
    assert plan.user == "10001:10001" and plan.volumes == ("tg-j1-tensors",)
    forwarded = json.loads(plan.forwarded_body(plan.user))
    assert forwarded["HostConfig"]["Binds"] == ["tg-j1-tensors:/opt/ml/output/tensors:rw"]
    assert forwarded["HostConfig"]["CapDrop"] == ["ALL"] and forwarded["User"] == "10001:10001"
    assert "trainguard-net" not in forwarded["NetworkingConfig"]  # docker-py's null entry, ignored by Go too
    assert _names(forwarded, set()) <= FORWARDED_NAMES


@pytest.mark.parametrize("name", sorted(DANGEROUS_HOST_FIELDS))
def test_dangerous_host_fields_are_refused_as_spelled(name: str) -> None:
    with pytest.raises(Refused):
        _create(_with_host(**{name: DANGEROUS_HOST_FIELDS[name]}))


def _spellings(name: str) -> st.SearchStrategy[str]:
    """Spellings of a field name: each letter in either case, s as ſ, k as K, or a lookalike."""

    def variants(char: str) -> list[str]:
        options = [char, char.swapcase()]
        options += {"s": ["\u017f"], "k": ["\u212a"], "i": ["\u0130", "\u0131"]}.get(char.lower(), [])
        return options + [chr(0xFF00 + ord(char) - 0x20)] if char.isascii() and char.isalpha() else options

    return st.tuples(*(st.sampled_from(variants(char)) for char in name)).map("".join)


@settings(max_examples=400, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(DANGEROUS_HOST_FIELDS)))
def test_no_spelling_of_a_dangerous_host_field_gets_through(data: st.DataObject, name: str) -> None:
    key = data.draw(_spellings(name))
    spec = _with_host()
    spec["HostConfig"].pop(key, None)
    spec["HostConfig"][key] = DANGEROUS_HOST_FIELDS[name]
    with pytest.raises(Refused):
        _create(spec)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), name=st.sampled_from(["User", "HostConfig", "Image", "Labels", "Volumes", "Entrypoint"]))
def test_no_spelling_of_a_top_level_field_gets_through_unjudged(data: st.DataObject, name: str) -> None:
    key = data.draw(_spellings(name))
    spec = json.loads(json.dumps(LAUNCHER_SPEC))
    dangerous = {"User": "0", "HostConfig": {"Privileged": True}, "Image": "other", "Labels": {},
                 "Volumes": {"/x": {}}, "Entrypoint": ["sh"]}[name]  # fmt: skip
    spec[key] = dangerous
    if key == name:  # the exact spelling replaces the judged value; judged as such
        route = None
        try:
            route = _create(spec)
        except Refused:
            return
        forwarded = json.loads(route.container.forwarded_body(route.container.user))
        assert forwarded[name] == dangerous and name in ("Image", "Volumes", "Entrypoint")
        return
    with pytest.raises(Refused):  # a second spelling of a field: twice, misspelled or unknown
        _create(spec)


def test_fields_are_matched_as_go_matches_them() -> None:
    known = ("Binds", "User")
    assert fields_of(decode_json(b'{"Binds": [], "User": null}'), known, "x") == {"Binds": []}
    with pytest.raises(Refused, match="read by the engine as 'Binds'"):
        fields_of(decode_json('{"bind\u017f": []}'.encode()), known, "x")
    with pytest.raises(Refused, match="twice"):
        fields_of(decode_json(b'{"Binds": [], "BINDS": []}'), known, "x")
    with pytest.raises(Refused, match="not a field"):
        fields_of(decode_json('{"B\u0131nds": []}'.encode()), known, "x")
    for body in (b"[]", b'"x"', b"1", b"null"):
        with pytest.raises(BadRequest):
            fields_of(decode_json(body), known, "x") if body != b"null" else decode_object(body)
        for path in ("/containers/create", "/volumes/create"):
            with pytest.raises(BadRequest, match="JSON object"):
                ProxyPolicy().route("POST", path, "", body)
    for body in (b'{"a": NaN}', b"{} {}", b"\xef\xbb\xbf{}", b'{"a": "\xff"}', "{}".encode("utf-16"), b"[" * 100000):
        with pytest.raises(BadRequest):
            decode_json(body)


# -- users -----------------------------------------------------------------------------------------
ROOT_SPELLINGS = ("", "0", "00", "0000", "+0", "-0", "0000:0000", "0:0", ":10001", "root", "root:root", "10001:0",
                  "10001:root", "+00:10001", "-000", "0:")  # fmt: skip


@pytest.mark.parametrize("user", ROOT_SPELLINGS)
def test_every_spelling_of_root_is_refused(user: str) -> None:
    with pytest.raises(Refused, match="root"):
        parse_user(user)
    spec = json.loads(json.dumps(LAUNCHER_SPEC))
    spec["User"] = user
    if user:
        with pytest.raises(Refused, match="root"):
            _create(spec)


def _go_atoi(text: str) -> int | None:
    """strconv.Atoi as the runtime uses it: optional sign, ASCII digits, int64."""
    body = text[1:] if text[:1] in "+-" else text
    if not body or any(char not in "0123456789" for char in body):
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.text(alphabet="0+- :\u0660\uff10\u00b2 \t1", max_size=8),
    st.from_regex(r"[+-]?0+(:[+-]?0*[0-9]?)?", fullmatch=True),
    st.text(max_size=12),
))  # fmt: skip
def test_a_user_is_accepted_only_as_a_non_zero_number_and_forwarded_canonically(user: str) -> None:
    try:
        parsed = parse_user(user)
    except Refused:
        return
    name, _, group = user.partition(":")
    uid = _go_atoi(name)
    assert uid is not None and uid > 0, user  # the runtime reads it as this number, not a name, not 0
    assert parsed.uid == uid and parsed.spec().split(":")[0] == str(uid)
    if group:
        gid = _go_atoi(group)
        assert gid is not None and gid > 0 and parsed.gid == gid


# -- volumes and mounts ----------------------------------------------------------------------------
def test_volumes_come_only_from_the_local_driver_without_options() -> None:
    policy = ProxyPolicy()
    ok = policy.route("POST", "/volumes/create", "", b'{"Name": "tg-j-v", "Driver": null, "DriverOpts": {}, '
                      b'"Labels": {"trainguard.job": "j"}}')  # fmt: skip
    assert json.loads(ok.body) == {"Driver": "local", "Labels": {JOB_LABEL: "j"}, "Name": "tg-j-v"}
    for body in (
        {"Name": "v", "Driver": "local", "DriverOpts": {"type": "none", "o": "bind", "device": "/"}},
        {"Name": "v", "Driver": "local", "DriverOpt\u017f": {"device": "/"}},
        {"Name": "v", "Driver": "rexray"},
        {"Name": "v", "ClusterVolumeSpec": {}},
        {"Name": "../x"},
    ):
        with pytest.raises(Refused):
            policy.route("POST", "/volumes/create", "", _body({**body, "Labels": {JOB_LABEL: "j"}}))


@pytest.mark.parametrize(
    "mount",
    [
        {"Type": "volume", "Source": "v", "Target": "/h",
         "VolumeOptions": {"DriverConfig": {"Name": "local", "Options": {"type": "none", "o": "bind", "device": "/"}}}},
        {"Type": "volume", "Source": "v", "Target": "/h", "volumeoptions": {"DriverConfig": {"Name": "x"}}},
        {"Type": "volume", "Source": "v", "Target": "/h", "VolumeOption\u017f": {"NoCopy": True}},
        {"Type": "volume", "Source": "v", "Target": "/h", "DriverConfig": {"Name": "x"}},
        {"Type": "bind", "Source": "/srv/tg/../../etc", "Target": "/h"},
        {"Type": "bind", "Source": "/srv/tg/x", "Target": "/h", "BindOptions": {"Propagation": "rshared"}},
        {"Type": "npipe", "Source": "x", "Target": "/h"},
        {"Type": "tmpfs", "Source": "/etc", "Target": "/h"},
        {"Type": "volume", "Source": "/etc", "Target": "/h"},
    ],
)  # fmt: skip
def test_mounts_with_driver_options_propagation_or_host_paths_are_refused(mount: dict) -> None:
    with pytest.raises(Refused):
        _create(_with_host(Mounts=[mount]), ProxyPolicy(bind_roots=("/srv/tg",)))


def test_binds_name_volumes_or_plain_paths_under_the_roots() -> None:
    policy = ProxyPolicy(bind_roots=("/srv/tg",))
    plan = _create(_with_host(Binds=["/srv/tg/j1:/data", "tg-v:/v:ro", "/anon"]), policy).container
    assert plan.volumes == ("tg-v",)
    for bind in ("/srv/tg/./j1:/d", "/srv/tg//j1:/d", "/srv/tg/j1/../..:/d", "/srv/tgX:/d", "/:/d", "v:/d:Z",
                 "v:/d:rshared", "v:/d:rw:x", "./v:/d", "v:/", "v:ro", "/srv/tg/j1:/d:z"):  # fmt: skip
        with pytest.raises(Refused):
            _create(_with_host(Binds=[bind]), policy)


# -- routes, queries and versions ------------------------------------------------------------------
@pytest.mark.parametrize(
    "method, path, query, body",
    [
        ("POST", "/v1.23/containers/abc/start", "", b'{"Binds": ["/:/host"]}'),  # applied by API < 1.24
        ("POST", "/v1.41/containers/abc/start", "", b'{"Binds": ["/:/host"]}'),  # no body on start
        ("POST", "/v1.40/containers/create", "", _body(LAUNCHER_SPEC)),
        ("GET", "/v2.0/containers/json", "", b""),
        ("GET", "/v1.41/containers/../../info", "", b""),
        ("GET", "/v1.41/containers/%2e%2e/json", "", b""),
        ("GET", "/v1.41//containers/json", "", b""),
        ("GET", "http://docker/info", "", b""),
        ("GET", "/images/a/../../containers/x/json", "", b""),
        ("POST", "/containers/create", "name=a&name=b", _body(LAUNCHER_SPEC)),
        ("POST", "/containers/create", "platform=linux/arm64", _body(LAUNCHER_SPEC)),
        ("POST", "/containers/create", "name=a;platform=x", _body(LAUNCHER_SPEC)),
        ("DELETE", "/containers/abc", "link=1", b""),
        ("GET", "/containers/json", "filters=" + quote('{"label": ["a"], "label": []}'), b""),
        ("GET", "/containers/json", "since=abc", b""),
        ("POST", "/containers/abc/exec", "", b"{}"),
        ("POST", "/containers/abc/update", "", b"{}"),
    ],
)  # fmt: skip
def test_requests_that_change_meaning_on_the_way_are_refused(method: str, path: str, query: str, body: bytes) -> None:
    with pytest.raises(Refused):
        ProxyPolicy().route(method, path, query, body)


def test_queries_are_forwarded_canonically_and_listings_narrowed() -> None:
    policy = ProxyPolicy()
    assert policy.route("DELETE", "/v1.41/containers/abc", "v=False&link=False&force=True", b"").path == (
        "/v1.41/containers/abc?v=0&force=1"
    )
    listing = policy.route("GET", "/containers/json", "all=1&filters=" + json.dumps({"label": {"x=1": True}}), b"")
    assert "trainguard.job" in listing.path and "x%3D1" in listing.path
    assert policy.route("POST", "/containers/abc/stop", "t=010", b"").on("abcdef0123").path == (
        "/containers/abcdef0123/stop?t=10"
    )



def test_a_file_is_read_from_a_labelled_container_by_an_absolute_path_only() -> None:
    """How the API reads the uploader's status file out of its container (``docker cp``)."""
    policy = ProxyPolicy()
    wanted = "/opt/ml/output/tensors/.uploader-status.json"
    route = policy.route("GET", "/v1.41/containers/abc/archive", f"path={wanted}", b"")
    assert route.labelled_container == "abc"  # the server checks the job label before it reads
    assert route.on("abcdef0123").path == f"/v1.41/containers/abcdef0123/archive?path={quote(wanted, safe='')}"
    for path in ("etc/passwd", "/opt/../etc/passwd", "/opt/ml/..", "/a//b", "/a/./b", ""):
        with pytest.raises((BadRequest, Refused)):
            policy.route("GET", "/containers/abc/archive", f"path={path}", b"")
    for method in ("PUT", "HEAD"):  # writing into a container, or its stat alone, is not needed
        with pytest.raises(Refused):
            policy.route(method, "/containers/abc/archive", f"path={wanted}", b"")


# -- the HTTP server against a recording stand-in engine ---------------------------------------------
class _Engine(BaseHTTPRequestHandler):
    """Answers inspects as a labelled engine would and records every request it gets."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, bytes]] = []

    def address_string(self) -> str:  # a Unix socket has no peer address
        return "engine"

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _Engine.seen.append((self.command, self.path, body))
        path = self.path.split("?")[0]
        labels = {JOB_LABEL: "j"}
        if path.startswith("/volumes/") and self.command == "GET":
            labels = {JOB_LABEL: LAUNCHER_SPEC["Labels"][JOB_LABEL]}  # the job's own volume
            answer: Any = {"Name": path.rsplit("/", 1)[1], "Driver": "local", "Options": None, "Labels": labels}
        elif path.startswith("/images/"):
            answer = {"Config": {"User": "10001"}}
        elif path.startswith("/containers/") and path.endswith("/json") and path != "/containers/json":
            answer = {"Id": "f" * 64, "Config": {"Labels": labels}}
        else:
            answer = {"Id": "c" * 64}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _answer


@pytest.fixture
def proxy_and_engine(tmp_path: Path):  # noqa: ANN201 - (port, recorded requests)
    import socketserver

    class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    engine = UnixServer(str(tmp_path / "engine.sock"), _Engine)
    proxy = DockerProxy(("127.0.0.1", 0), str(tmp_path / "engine.sock"), ProxyPolicy())
    for server in (engine, proxy):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    _Engine.seen = []
    yield proxy.server_address[1], _Engine.seen
    for server in (proxy, engine):
        server.shutdown()
        server.server_close()


def _exchange(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(raw)
        connection.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_the_engine_gets_the_rebuilt_body_never_the_clients_bytes(proxy_and_engine) -> None:  # noqa: ANN001
    port, seen = proxy_and_engine
    spec = json.loads(json.dumps(LAUNCHER_SPEC))
    spec["User"] = "+010001:010001"
    spec["HostConfig"]["NetworkMode"] = "default"
    body = json.dumps(spec, indent=3).encode()
    answer = _exchange(port, b"POST /v1.41/containers/create?name=tg-j1-training HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Type: application/json\r\nX-Registry-Auth: secret\r\nConnection: close\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
    assert answer.startswith(b"HTTP/1.1 200"), answer
    created = [entry for entry in seen if entry[0] == "POST"]
    assert [entry[1] for entry in created] == ["/v1.41/containers/create?name=tg-j1-training"]
    forwarded = created[0][2]
    assert forwarded != body and b" " not in forwarded  # canonical serialisation
    assert json.loads(forwarded)["User"] == "10001:10001"
    assert _names(json.loads(forwarded), set()) <= FORWARDED_NAMES


@pytest.mark.parametrize(
    "raw",
    [
        # Content-Length + Transfer-Encoding: a chunked reader would see the smuggled create
        b"POST /v1.41/containers/abc/start HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        b"POST /v1.41/containers/create HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        b"POST /v1.41/containers/abc/start HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n",
        b"POST /v1.41/volumes/create HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 80\r\n\r\n{}",
        b"POST /v1.41/volumes/create HTTP/1.1\r\nHost: x\r\nContent-Length: +2\r\n\r\n{}",
        b"POST /v1.41/volumes/create HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}",
    ],
)  # fmt: skip
def test_framing_tricks_reach_nothing(proxy_and_engine, raw: bytes) -> None:  # noqa: ANN001
    port, seen = proxy_and_engine
    answer = _exchange(port, raw)
    assert answer.split(b" ", 2)[1] in (b"400", b"411", b"415"), answer
    time.sleep(0.1)
    assert [entry for entry in seen if entry[0] != "GET"] == []  # nothing was created, started or changed


def test_a_pipelined_dangerous_request_is_judged_on_its_own(proxy_and_engine) -> None:  # noqa: ANN001
    port, seen = proxy_and_engine
    bad = _body(_with_host(Privileged=True))
    answer = _exchange(port, b"GET /_ping HTTP/1.1\r\nHost: x\r\n\r\n"
                             b"POST /containers/create HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(bad), bad))  # fmt: skip
    assert answer.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 403" in answer, answer
    assert [entry[1] for entry in seen] == ["/_ping"]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=10), children, max_size=3),
    max_leaves=8,
)
# Per field: values the engine would take, safe and harmful alike, so that many bodies are accepted.
_PLAUSIBLE: dict[str, list[Any]] = {
    "User": ["10001", "+010001:10001", "0", "root", "10001:0", "00"], "Env": [["A=b"], []], "Cmd": ["true", ["a"]],
    "Entrypoint": ["sh", []], "WorkingDir": ["/w", ""], "Image": ["img:2"], "Hostname": ["h"], "StopTimeout": [5],
    "Labels": [{JOB_LABEL: "j"}, {JOB_LABEL: ""}, {}], "Volumes": [{"/a": {}}, {"/": {}}, {"/a": {"x": 1}}],
    "Binds": [["tg-v:/v"], ["/:/h"], ["/anon"], ["tg-v:/v:Z"]], "NetworkMode": ["trainguard-net", "host", "bridge"],
    "Mounts": [[{"Type": "volume", "Source": "tg-v", "Target": "/v"}],
               [{"Type": "bind", "Source": "/", "Target": "/h"}],
               [{"Type": "tmpfs", "Target": "/t", "TmpfsOptions": {"SizeBytes": 1024}}]],
    "RestartPolicy": [{"Name": "always"}, {"Name": "x"}], "CapDrop": ["ALL", ["all", "NET_RAW"], []],
    "SecurityOpt": [["no-new-privileges:true"], ["label=disable"]], "Privileged": [False, True],
    "CapAdd": [[], ["ALL"]],
    "Type": ["tmpfs", "volume", "bind"], "Source": ["", "tg-v", "/"], "Target": ["/t", "/"], "ReadOnly": [True],
    "Name": ["on-failure", "no"], "MaximumRetryCount": [3, -1], "Memory": [1 << 20, -1], "PidsLimit": [64],
    "Init": [True], "Tty": [True], "Devices": [[{"PathOnHost": "/dev/sda"}]], "TmpfsOptions": [{"Mode": 448}],
}  # fmt: skip
_LEVELS = {
    "top": ["User", "Env", "Cmd", "Entrypoint", "WorkingDir", "Image", "Hostname", "StopTimeout", "Labels", "Volumes",
            "Tty", "HostConfig", "NetworkingConfig", "Binds"],
    "HostConfig": ["Binds", "NetworkMode", "Mounts", "RestartPolicy", "CapDrop", "SecurityOpt", "Privileged", "CapAdd",
                   "Memory", "PidsLimit", "Init", *DANGEROUS_HOST_FIELDS],
    "Mounts": ["Type", "Source", "Target", "ReadOnly", "TmpfsOptions", "VolumeOptions", "BindOptions"],
    "RestartPolicy": ["Name", "MaximumRetryCount"],
}  # fmt: skip


def _members(where: str) -> st.SearchStrategy[dict[str, Any]]:
    member = st.sampled_from(sorted(set(_LEVELS[where]))).flatmap(
        lambda name: st.tuples(
            st.one_of(st.just(name), st.just(name), st.just(name), _spellings(name)),
            st.one_of(
                st.sampled_from(_PLAUSIBLE.get(name, [None])), st.sampled_from(_PLAUSIBLE.get(name, [None])), _JSON
            ),
        )
    )
    unknown = st.tuples(st.text(max_size=14), _JSON)
    return st.lists(st.one_of(member, member, member, unknown), min_size=1, max_size=3).map(dict)


@settings(max_examples=250, deadline=None)
@given(data=st.data(), where=st.sampled_from(sorted(_LEVELS)))
def test_whatever_a_body_holds_only_judged_canonical_fields_are_forwarded(data: st.DataObject, where: str) -> None:
    members = data.draw(_members(where))
    spec = _with_host(Mounts=[{"Type": "tmpfs", "Target": "/scratch"}])
    target = {
        "top": spec,
        "HostConfig": spec["HostConfig"],
        "Mounts": spec["HostConfig"]["Mounts"][0],
        "RestartPolicy": spec["HostConfig"]["RestartPolicy"],
    }[where]
    target.update(members)
    try:
        plan = _create(spec).container
    except Refused:
        return
    forwarded = json.loads(plan.forwarded_body(plan.user or "10001"))
    assert _names(forwarded, set()) <= FORWARDED_NAMES
    host = forwarded["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and host["SecurityOpt"] == ["no-new-privileges"]
    assert not {"Privileged", "CapAdd", "Devices"} & set(host)
    for mount in host.get("Mounts", []):
        assert mount["Type"] in ("tmpfs", "volume") and not mount.get("Source", "").startswith("/")
    assert all(not bind.startswith("/") or ":" not in bind for bind in host.get("Binds", []))
    assert parse_user(forwarded["User"]).uid > 0
    assert forwarded["Labels"][JOB_LABEL]


def test_a_fault_of_the_proxy_is_a_500_that_forwards_nothing(proxy_and_engine, monkeypatch) -> None:  # noqa: ANN001
    port, seen = proxy_and_engine

    def broken(*_: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(ProxyPolicy, "route", broken)
    answer = _exchange(port, b"GET /_ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 500") and b"RuntimeError" in answer and seen == []
