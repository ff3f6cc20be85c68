"""What a request may make the server load or touch: rule references, rule files, working dirs,
webhook URLs, and what the Docker proxy forwards (its decisions, without an engine; the proxy
against the real engine is tests/e2e/test_docker_proxy.py)."""

from __future__ import annotations

import ipaddress
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from trainguard.services.actions.context import ActionContext
from trainguard.services.actions.handlers import check_webhook_url, webhook
from trainguard.services.actions.outbound_policy import OutboundPolicy
from trainguard.services.api.policy import PolicyError, SourcePolicy
from trainguard.services.docker_proxy.rules import JOB_LABEL, ProxyPolicy, Refused


# -- rule references -------------------------------------------------------------------------------
def test_module_references_need_the_allow_list_and_are_refused_before_import() -> None:
    policy = SourcePolicy(rule_modules=("tests.services.rules_for_tests", "acme_rules"))
    policy.check_rule_reference("ExplodingTensor")  # names are looked up by the registry, not imported here
    policy.check_rule_reference("tests.services.rules_for_tests:LossAboveThreshold")
    policy.check_rule_reference("acme_rules.vision:Blur")  # a module of an allowed package
    for refused in ("os:system", "subprocess:Popen", "acme_rulesX:Y", "builtins:eval", "tests.services:X"):
        with pytest.raises(PolicyError, match="allow-list"):
            policy.check_rule_reference(refused)
    for malformed in (".x:Y", "a..b:C", "a:B.c", "a:", ":B", "a b:C", "a:B()"):
        with pytest.raises(PolicyError):
            policy.check_rule_reference(malformed)
    with pytest.raises(PolicyError, match="none configured"):
        SourcePolicy().check_rule_reference("tests.services.rules_for_tests:LossAboveThreshold")


# -- rule source files ---------------------------------------------------------------------------
def test_source_uri_is_s3_or_a_file_under_the_roots(tmp_path: Path) -> None:
    root = tmp_path / "rules"
    root.mkdir()
    (root / "mine.py").write_text("x = 1\n")
    outside = tmp_path / "secret.py"
    outside.write_text("x = 2\n")
    (root / "link.py").symlink_to(outside)
    policy = SourcePolicy(source_roots=(root,))
    policy.check_source_uri("s3://bucket/rules/mine.py")
    policy.check_source_uri(str(root / "mine.py"))
    for refused in (
        str(outside), str(root / "link.py"), str(root / ".." / "secret.py"), "file:///etc/passwd",
        "http://evil.example/x.py", "rules/mine.py", str(root / "mine.txt"), "s3://bucket", "s3:///key.py",
    ):  # fmt: skip
        with pytest.raises(PolicyError):
            policy.check_source_uri(refused)
    with pytest.raises(PolicyError, match="disabled"):
        SourcePolicy().check_source_uri(str(root / "mine.py"))


def test_working_dir_stays_inside_the_job_dir(tmp_path: Path) -> None:
    job = tmp_path / "jobs" / "a"
    job.mkdir(parents=True)
    assert SourcePolicy.check_working_dir("work", job) == (job / "work").resolve()
    assert SourcePolicy.check_working_dir(str(job / "x"), job) == (job / "x").resolve()
    for refused in ("/tmp", "/", "../b", "work/../../b", str(tmp_path), "a\x00b"):
        with pytest.raises(PolicyError):
            SourcePolicy.check_working_dir(refused, job)


# -- webhooks ------------------------------------------------------------------------------------
def test_webhook_urls_are_http_only_also_after_a_redirect(tmp_path: Path) -> None:
    check_webhook_url("https://hooks.example.com/x")
    check_webhook_url("http://127.0.0.1:9/x")
    for refused in ("file:///etc/passwd", "ftp://example.com/x", "data:,hi", "gopher://x", "http://", "javascript:x",
                    "http://example.com/a b", "http://example.com/\r\nX: y"):  # fmt: skip
        with pytest.raises(ValueError):
            check_webhook_url(refused)
    secret = tmp_path / "secret"
    secret.write_text("do not send")

    class Redirect(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(302)  # urllib follows a 302 after a POST (as a GET)
            # urllib itself refuses a redirect to file://, but follows one to ftp://: ours must not.
            self.send_header("Location", "ftp://127.0.0.1:1/secret" if "ftp" in self.path else f"file://{secret}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:  # noqa: ANN002
            pass

    server = HTTPServer(("127.0.0.1", 0), Redirect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        loopback = OutboundPolicy(allowed_networks=(ipaddress.ip_network("127.0.0.1/32"),))  # the test server's
        context = ActionContext(job_name="j", stop_job=lambda *a: None, in_progress_jobs=lambda: [], outbound=loopback)
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        with pytest.raises(RuntimeError, match="HTTP 302 redirect to 'ftp://.* not followed"):
            webhook({"detail": {}}, {"name": "webhook", "url": url + "?ftp", "retries": 0}, context)
        with pytest.raises(RuntimeError, match="HTTP 302 redirect to 'file://.* not followed"):
            webhook({"detail": {}}, {"name": "webhook", "url": url, "retries": 0}, context)
        with pytest.raises(ValueError, match="only http"):
            webhook({"detail": {}}, {"name": "webhook", "url": f"file://{secret}"}, context)
    finally:
        server.shutdown()
        server.server_close()


# -- the Docker proxy's decisions ------------------------------------------------------------------
def _create(**host_config) -> bytes:
    return json.dumps({
        "Image": "x", "Labels": {JOB_LABEL: "j"},
        "HostConfig": {"CapDrop": ["ALL"], "SecurityOpt": ["no-new-privileges"], **host_config},
    }).encode()  # fmt: skip


def test_docker_proxy_routes_only_what_the_launcher_needs() -> None:
    policy = ProxyPolicy()
    assert policy.route("POST", "/v1.41/containers/create", "name=tg-j-training", _create()).path.startswith(
        "/v1.41/containers/create?name="
    )
    route = policy.route("GET", "/v1.41/containers/json", "all=1", b"")
    query = parse_qs(route.path.split("?", 1)[1])
    assert json.loads(query["filters"][0]) == {"label": [JOB_LABEL]} and query["all"] == ["1"]
    narrowed = policy.route("GET", "/volumes", "filters=" + json.dumps({"label": [f"{JOB_LABEL}=j"]}), b"")
    assert json.loads(parse_qs(narrowed.path.split("?", 1)[1])["filters"][0]) == {"label": [f"{JOB_LABEL}=j"]}
    assert policy.route("POST", "/containers/abc/stop", "t=10", b"").labelled_container == "abc"
    assert policy.route("DELETE", "/volumes/tg-j-tensors", "", b"").labelled_volume == "tg-j-tensors"
    for method, path in (("POST", "/containers/abc/exec"), ("POST", "/exec/abc/start"), ("POST", "/images/create"),
                         ("POST", "/build"), ("GET", "/info"), ("POST", "/swarm/init"), ("POST", "/plugins/pull"),
                         ("PUT", "/containers/abc/archive"), ("GET", "/containers/abc/archive"),
                         ("POST", "/containers/abc/update"), ("POST", "/networks/create")):  # fmt: skip
        with pytest.raises(Refused):
            policy.route(method, path, "", b"{}")


@pytest.mark.parametrize(
    "host_config",
    [
        {"Binds": ["/:/host"]}, {"Binds": ["/etc:/x:ro"]}, {"Binds": ["/var/lib/docker/../../:/x"]},
        {"Mounts": [{"Type": "bind", "Source": "/", "Target": "/h"}]}, {"Mounts": [{"Type": "npipe"}]},
        {"Privileged": True}, {"CapAdd": ["NET_ADMIN"]}, {"CapDrop": ["NET_RAW"]},
        {"NetworkMode": "host"}, {"NetworkMode": "container:abc"}, {"PidMode": "host"}, {"IpcMode": "host"},
        {"UTSMode": "host"}, {"UsernsMode": "host"}, {"CgroupnsMode": "host"},
        {"Devices": [{"PathOnHost": "/dev/mem"}]}, {"DeviceRequests": [{"Count": -1}]}, {"VolumesFrom": ["x"]},
        {"Sysctls": {"kernel.x": "1"}}, {"Runtime": "sysbox"},
        {"SecurityOpt": ["apparmor=unconfined", "no-new-privileges"]},
        {"SecurityOpt": ["no-new-privileges=false"]}, {"CgroupParent": "/"}, {"Binds": "not-a-list"},
    ],
)  # fmt: skip
def test_docker_proxy_refuses_weakened_containers(host_config: dict) -> None:
    with pytest.raises(Refused):
        ProxyPolicy().route("POST", "/containers/create", "", _create(**host_config))


def test_docker_proxy_networks_are_limited_to_the_jobs_network() -> None:
    policy = ProxyPolicy(allowed_networks=("trainguard-net",))
    policy.route("GET", "/v1.41/networks/trainguard-net", "", b"")
    policy.route("POST", "/containers/create", "", _create(NetworkMode="trainguard-net"))
    with pytest.raises(Refused):
        policy.route("GET", "/v1.41/networks/bridge", "", b"")
    with pytest.raises(Refused):
        policy.route("POST", "/containers/create", "", _create(NetworkMode="other-net"))


def test_docker_proxy_bind_roots_and_field_case() -> None:
    policy = ProxyPolicy(bind_roots=("/srv/trainguard",))
    policy.route("POST", "/containers/create", "", _create(Binds=["/srv/trainguard/job1:/data"]))
    with pytest.raises(Refused):
        policy.route("POST", "/containers/create", "", _create(Binds=["/srv/trainguard/../etc:/data"]))
    with pytest.raises(Refused):
        policy.route("POST", "/containers/create", "", _create(Binds=["/srv/trainguardX:/data"]))
    lowercase = json.loads(_create())
    lowercase["HostConfig"]["privileged"] = True  # dockerd reads it as Privileged
    with pytest.raises(Refused, match="privileged"):
        policy.route("POST", "/containers/create", "", json.dumps(lowercase).encode())
    duplicate = b'{"Labels": {"trainguard.job": "j"}, "HostConfig": {"CapDrop": ["ALL"], ' \
                b'"SecurityOpt": ["no-new-privileges"], "Privileged": false, "Privileged": true}}'  # fmt: skip
    with pytest.raises(Refused, match="twice"):
        policy.route("POST", "/containers/create", "", duplicate)
    unlabelled = json.loads(_create())
    unlabelled["Labels"] = {"Trainguard.Job": "j"}  # label keys are case-sensitive
    with pytest.raises(Refused, match="label"):
        policy.route("POST", "/containers/create", "", json.dumps(unlabelled).encode())
    with pytest.raises(Refused, match="label"):
        policy.route("POST", "/volumes/create", "", b'{"Name": "v"}')


def test_event_webhook_setting_is_http_only() -> None:
    from trainguard.services.api.settings import Settings

    from trainguard.errors import ConfigError

    base = {"TRAINGUARD_API_TOKEN": "t" * 16}
    assert Settings.from_env({**base, "TRAINGUARD_EVENT_WEBHOOK_URL": "https://x.example/e"}).event_webhook_url
    for refused in ("file:///etc/passwd", "ftp://x.example/e"):
        with pytest.raises(ConfigError, match="http"):
            Settings.from_env({**base, "TRAINGUARD_EVENT_WEBHOOK_URL": refused})
