"""Webhooks reach only where the outbound policy allows, at the address it checked, never redirected.

Every refusal is shown against a real HTTP server that would have received the request (one
listening on every local address, IPv4 and IPv6), and by Python's audit hook that no socket
connection was even attempted. Targets with no local address (10.x, 169.254.x, ...) are shown by
the audit hook alone.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from trainguard.services.actions import ActionContext, get_handler
from trainguard.services.actions.outbound_policy import OutboundPolicy, OutboundRefused, parse_allow_list, refusal_reason
from trainguard.services.actions.validation import check_action_fields
from tests.services.notify_servers import RecordingHttpServer

_recording: list[tuple[object, ...]] | None = None


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event == "socket.connect" and _recording is not None:
        _recording.append(args[1])


sys.addaudithook(_audit)  # audit hooks cannot be removed; it records only inside connections_made()


@contextmanager
def connections_made() -> Iterator[list[tuple[object, ...]]]:
    """Every address this process's sockets tried to connect to inside the block."""
    global _recording
    _recording = made = []
    try:
        yield made
    finally:
        _recording = None


def _context(policy: OutboundPolicy | None = None, timeout: float = 5.0) -> ActionContext:
    return ActionContext(job_name="job-1", stop_job=lambda *a: None, in_progress_jobs=lambda: [],
                         webhook_timeout=timeout, outbound=policy or OutboundPolicy())  # fmt: skip


def _send(url: str, context: ActionContext, retries: int = 0) -> str:
    return get_handler("webhook")({"detail": {"TrainingJobName": "job-1"}}, {"name": "webhook", "url": url,
                                                                           "retries": retries}, context)  # fmt: skip


def _allow(*entries: str, **kwargs: object) -> OutboundPolicy:
    networks, hosts = parse_allow_list(entries)
    return OutboundPolicy(networks, hosts, **kwargs)


# -- refused by default ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("address", "reason"),
    [("127.0.0.1", "loopback"), ("127.9.9.9", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
     ("localhost", "loopback"), ("0.0.0.0", "unspecified"), ("::", "unspecified"),
     # other spellings of 127.0.0.1 the resolver (inet_aton) accepts
     ("2130706433", "loopback"), ("0x7f000001", "loopback"), ("0177.0.0.1", "loopback"), ("127.1", "loopback")],
)  # fmt: skip
def test_loopback_and_unspecified_targets_are_refused_and_nothing_arrives(address: str, reason: str) -> None:
    with RecordingHttpServer(host="::") as server:
        url = server.url_at(address)
        # The server is really there: allowed, the same URL is delivered.
        _send(url, _context(_allow("127.0.0.0/8", "::1", "::/128", "0.0.0.0/32", "localhost")))
        assert server.attempts == 1
        with connections_made() as made, pytest.raises(OutboundRefused, match=reason):
            _send(url, _context(), retries=3)
    assert server.attempts == 1 and made == []


def _machine_addresses() -> list[str]:
    psutil = pytest.importorskip("psutil", reason="listing this machine's addresses needs psutil")
    found = []
    for addresses in psutil.net_if_addrs().values():
        for entry in addresses:
            if entry.family in (socket.AF_INET, socket.AF_INET6) and "%" not in entry.address:
                found.append(entry.address)
    return found


def test_the_machines_own_private_addresses_are_refused_and_nothing_arrives() -> None:
    internal = [a for a in _machine_addresses() if refusal_reason(ipaddress.ip_address(a))]
    with RecordingHttpServer(host="::") as server:
        for address in internal:
            with connections_made() as made, pytest.raises(OutboundRefused, match="may not reach"):
                _send(server.url_at(address), _context())
            assert made == [], address
    assert server.attempts == 0
    print(f"refused, nothing arrived: {internal}")


@pytest.mark.parametrize(
    "host",
    ["10.0.0.1", "10.255.255.254", "169.254.169.254", "169.254.0.1", "172.16.0.1", "172.31.255.1", "192.168.1.1",
     "100.64.0.1", "100.127.255.254", "224.0.0.1", "239.255.255.250", "255.255.255.255", "[fe80::1]", "[fc00::1]",
     "[fd12:3456::1]", "[ff02::1]", "[::ffff:10.0.0.1]", "[::ffff:169.254.169.254]", "[::ffff:192.168.0.1]",
     "[::ffff:100.64.0.1]", "[64:ff9b::a9fe:a9fe]", "[2002:a00:1::1]"],
)  # fmt: skip
def test_internal_ranges_are_refused_before_any_connection(host: str) -> None:
    with connections_made() as made, pytest.raises(OutboundRefused, match="may not reach"):
        _send(f"http://{host}:8080/hook", _context(), retries=3)
    assert made == []


def test_a_name_with_any_internal_record_is_refused() -> None:
    policy = OutboundPolicy(resolver=lambda host, port: ["93.184.216.34", "10.0.0.7"])
    with connections_made() as made, pytest.raises(OutboundRefused, match="10.0.0.7, a private address"):
        _send("http://hooks.example.test/x", _context(policy))
    assert made == []


# -- the stack's own services ----------------------------------------------------------------------
def test_the_stacks_own_services_are_refused_even_where_their_network_is_allowed() -> None:
    from trainguard.services.api.settings import Settings

    with RecordingHttpServer() as proxy, RecordingHttpServer() as s3, RecordingHttpServer() as receiver:
        settings = Settings.from_env({
            "TRAINGUARD_API_TOKEN": "t" * 16, "TRAINGUARD_PORT": "18080",
            "DOCKER_HOST": f"tcp://127.0.0.1:{proxy.port}", "S3_ENDPOINT_URL": s3.url_at("localhost", ""),
            "TRAINGUARD_WEBHOOK_ALLOW": "127.0.0.0/8,localhost",
        })  # fmt: skip
        context = _context(OutboundPolicy.from_settings(settings))
        for url in (proxy.url, proxy.url_at("localhost"), proxy.url_at("::ffff:127.0.0.1"), s3.url, s3.url_at("127.0.0.1"),
                    "http://127.0.0.1:18080/v1/jobs"):  # fmt: skip
            with connections_made() as made, pytest.raises(OutboundRefused, match="the stack's own service"):
                _send(url, context)
            assert made == [], url
        assert "HTTP 204" in _send(receiver.url, context)  # the allowed network, not a service: delivered
    assert proxy.attempts == 0 and s3.attempts == 0 and receiver.attempts == 1


def test_the_event_webhook_the_operator_set_is_allowed() -> None:
    from trainguard.services.api.settings import Settings

    with RecordingHttpServer() as events:
        settings = Settings.from_env({"TRAINGUARD_API_TOKEN": "t" * 16, "TRAINGUARD_EVENT_WEBHOOK_URL": events.url})
        assert "HTTP 204" in _send(events.url, _context(OutboundPolicy.from_settings(settings)))
    assert events.attempts == 1


def test_a_bad_allow_list_entry_refuses_the_start() -> None:
    from trainguard.services.api.settings import Settings

    from trainguard.errors import ConfigError

    with pytest.raises(ConfigError, match="TRAINGUARD_WEBHOOK_ALLOW"):
        Settings.from_env({"TRAINGUARD_API_TOKEN": "t" * 16, "TRAINGUARD_WEBHOOK_ALLOW": "10.0.0.0/8,not a host!"})


# -- allowed, pinned, not redirected, bounded --------------------------------------------------------
@pytest.mark.parametrize("entry", ["127.0.0.1", "127.0.0.0/8", "localhost"])
def test_an_allow_list_entry_lets_a_webhook_reach_an_internal_receiver(entry: str) -> None:
    with RecordingHttpServer() as server:
        detail = _send(server.url_at("localhost" if entry == "localhost" else "127.0.0.1"), _context(_allow(entry)))
    assert "HTTP 204" in detail
    [delivery] = server.received
    assert delivery["body"]["detail"]["TrainingJobName"] == "job-1"


def test_the_connection_goes_to_the_checked_address_with_the_urls_host_name() -> None:
    lookups: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        lookups.append(host)
        return ["127.0.0.1"]

    with RecordingHttpServer() as server, connections_made() as made:
        _send(f"http://hooks.example.test:{server.port}/hook?x=1", _context(_allow("127.0.0.1", resolver=resolver)))
    [delivery] = server.received
    assert delivery["headers"]["Host"] == f"hooks.example.test:{server.port}" and delivery["path"] == "/hook?x=1"
    assert lookups == ["hooks.example.test"] and made == [("127.0.0.1", server.port)]


def test_a_second_dns_answer_cannot_move_the_connection() -> None:
    """DNS rebinding: the name passes with one answer, then would resolve to the forbidden receiver."""
    answers = iter([["127.0.0.2"], ["127.0.0.1"], ["127.0.0.1"]])
    policy = _allow("127.0.0.2/32", resolver=lambda host, port: next(answers))
    with RecordingHttpServer() as server, connections_made() as made:  # listens on 127.0.0.1 only
        with pytest.raises(RuntimeError, match="failed after 1 attempt"):
            _send(f"http://rebind.example.test:{server.port}/hook", _context(policy))
    assert made == [("127.0.0.2", server.port)] and server.attempts == 0


def test_redirects_are_not_followed() -> None:
    with RecordingHttpServer() as inside:
        with RecordingHttpServer(redirect_to=inside.url) as bouncer:
            with pytest.raises(RuntimeError, match="307 redirect to .* not followed"):
                _send(bouncer.url, _context(_allow("127.0.0.1")), retries=3)
        assert bouncer.attempts == 1  # a redirect is not retried
    assert inside.attempts == 0


def test_a_receiver_that_trickles_its_answer_is_cut_at_the_deadline() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000:
                if stop.wait(0.2):
                    return
                connection.sendall(bytes([byte]))

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="failed after 1 attempt"):
            _send(f"http://127.0.0.1:{listener.getsockname()[1]}/", _context(_allow("127.0.0.1"), timeout=1.0))
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        listener.close()
    assert elapsed < 2.0, elapsed  # one deadline for the attempt, not one per byte received


# -- what creation refuses -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("action", "field"),
    [({"name": "webhook", "url": "http://h.example/x\r\nX-Injected: 1"}, "url"),
     ({"name": "webhook", "url": "http://h.example/x\n"}, "url"),
     ({"name": "webhook", "url": "http://h.example/\x0bx"}, "url"),
     ({"name": "webhook", "url": "http://h.example/\u2028"}, "url"),
     ({"name": "webhook", "url": "http://h.example/x", "headers": {"X-A": "1\r\nX-Injected: 2"}}, "headers"),
     ({"name": "webhook", "url": "http://h.example/x", "headers": {"X-A\nB": "1"}}, "headers"),
     ({"name": "webhook", "url": "http://h.example/x", "headers": {"Host": "internal"}}, "headers"),
     ({"name": "webhook", "url": "http://user:pw@h.example/x"}, "url"),
     ({"name": "email", "endpoint": "oncall@example.com\r\nBcc: all@example.com"}, "endpoint"),
     ({"name": "email", "endpoint": "oncall@example.com, all@example.com"}, "endpoint"),
     ({"name": "sms", "endpoint": "+15551234567\n"}, "endpoint"),
     ({"name": "sns", "topic_arn": "arn:aws:sns:us-east-1:0:t\r\n"}, "topic_arn"),
     ({"name": "stoptraining", "training_job_prefix": "job\n"}, "training_job_prefix")],
)  # fmt: skip
def test_line_breaks_and_control_characters_are_refused_naming_the_field(action: dict, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}"):
        check_action_fields(action)


def test_ordinary_actions_pass_the_creation_check() -> None:
    for action in ({"name": "webhook", "url": "https://hooks.example.com/a?b=c", "headers": {"Authorization": "Bearer x"}},
                   {"name": "email", "endpoint": "on.call+ml@example.co.uk"}, {"name": "sms", "endpoint": "+15551234567"},
                   {"name": "stoptraining", "training_job_prefix": "exp-"}):  # fmt: skip
        check_action_fields(action)


def test_a_name_that_does_not_resolve_now_is_retried_not_refused() -> None:
    calls: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        calls.append(host)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    with pytest.raises(RuntimeError, match="failed after 2 attempt.*cannot resolve 'hooks.example.test'"):
        _send("http://hooks.example.test/x", _context(OutboundPolicy(resolver=resolver)), retries=1)
    assert calls == ["hooks.example.test"] * 2


def _self_signed(tmp_path, name: str) -> tuple[str, str]:
    """A certificate for ``name`` (and its key), self-signed, as PEM files."""
    x509 = pytest.importorskip("cryptography.x509", reason="the TLS test makes its certificate with cryptography")
    import datetime

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_path, key_path = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    return str(cert_path), str(key_path)


def test_https_goes_to_the_checked_address_with_the_name_in_sni_and_the_certificate_check(tmp_path) -> None:
    import ssl

    from trainguard.services.actions import pinned_http

    cert, key = _self_signed(tmp_path, "hooks.example.test")
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    server_names: list[str | None] = []
    server_context.sni_callback = lambda sock, name, context: server_names.append(name)
    client_context = ssl.create_default_context(cafile=cert)
    policy = _allow("127.0.0.1", resolver=lambda host, port: ["127.0.0.1"])
    with RecordingHttpServer() as server:
        server.server.socket = server_context.wrap_socket(server.server.socket, server_side=True)
        url = f"https://hooks.example.test:{server.port}/hook"
        result = pinned_http.post(url, b'{"detail": {}}', {"Content-Type": "application/json"}, policy=policy,
                                  timeout=5.0, tls_context=client_context)  # fmt: skip
        assert result.status == 204 and result.address == "127.0.0.1"
        assert server.received[0]["headers"]["Host"] == f"hooks.example.test:{server.port}"
        # The certificate is checked against the URL's name, not the address connected to.
        other = _allow("127.0.0.1", resolver=lambda host, port: ["127.0.0.1"])
        with pytest.raises(pinned_http.DeliveryError, match="CERTIFICATE_VERIFY_FAILED|certificate"):
            pinned_http.post(f"https://other.example.test:{server.port}/hook", b"{}", {}, policy=other, timeout=5.0,
                             tls_context=client_context)  # fmt: skip
    assert server_names[0] == "hooks.example.test" and len(server.received) == 1
