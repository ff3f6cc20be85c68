"""Where a webhook may connect: the address a URL resolves to, judged at send time.

A job's author chooses its webhook URLs, and the API sends them from inside the stack: without a
check a URL could reach the Docker proxy, the API itself, S3 or anything else on the API's
networks. By default a webhook may reach only globally routable addresses; loopback, link-local,
private, carrier-grade NAT, unspecified, multicast and reserved ranges are refused, also when
written as IPv4-mapped (or NAT64 / 6to4) IPv6. The operator may allow chosen internal targets
(``TRAINGUARD_WEBHOOK_ALLOW``: CIDRs, addresses or host names). The stack's own endpoints (the
Docker proxy, the API, S3, CloudWatch, SNS, Ray, the database) stay refused even then.

The check runs on the resolved addresses, and the caller connects to exactly the address that
passed (see :mod:`~trainguard.services.actions.pinned_http`), so a name that resolves differently
between the check and the connection (DNS rebinding) cannot slip through.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from trainguard.services.errors import ServiceError

from trainguard.errors import ConfigError

__all__ = ["OutboundPolicy", "OutboundRefused", "parse_allow_list", "refusal_reason"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Sequence[str]]

_CARRIER_GRADE_NAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)([A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)"
    r"(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?$"
)
_DEFAULT_PORTS = {"http": 80, "https": 443, "tcp": 2375, "postgresql": 5432, "postgres": 5432}


class OutboundRefused(ServiceError, ValueError):
    """A webhook's target is not one the service may connect to."""


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 form carries and a gateway or dual stack would reach."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


def refusal_reason(address: IPAddress) -> str | None:
    """Why a webhook may not connect to ``address`` by default, or None for a globally routable one."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            reason = refusal_reason(embedded)
            return f"{reason} (as IPv6 {address})" if reason else None
        if address.scope_id:
            return "link-local (scoped)"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_unspecified:
        return "unspecified"
    if address.is_multicast:
        return "multicast"
    if address in _CARRIER_GRADE_NAT:
        return "carrier-grade NAT"
    if address.is_private:
        return "private"
    if address.is_reserved or not address.is_global:
        return "not globally routable"
    return None


def _host_port(url: str) -> tuple[str, int] | None:
    """(host, port) of an endpoint URL from the settings (http://s3:5000, tcp://docker-proxy:2375, ...)."""
    if not url or url.startswith(("unix:", "npipe:")):
        return None
    parsed = urllib.parse.urlsplit(url if "://" in url else f"tcp://{url}")
    if not parsed.hostname:
        return None
    try:
        port = parsed.port
    except ValueError:
        return None
    return parsed.hostname, port or _DEFAULT_PORTS.get(parsed.scheme.lower().split("+")[0], 80)


def parse_allow_list(raw: str | Iterable[str]) -> tuple[tuple[IPNetwork, ...], frozenset[str]]:
    """Networks and host names of ``TRAINGUARD_WEBHOOK_ALLOW`` (comma-separated); ConfigError for a bad entry."""
    entries = raw.split(",") if isinstance(raw, str) else list(raw)
    networks: list[IPNetwork] = []
    hosts: set[str] = set()
    for entry in (e.strip() for e in entries):
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            continue
        except ValueError:
            pass
        if not _HOSTNAME.match(entry):
            raise ConfigError(
                f"TRAINGUARD_WEBHOOK_ALLOW: {entry[:80]!r} is neither a CIDR, an IP address nor a host name"
            )
        hosts.add(entry.rstrip(".").lower())
    return tuple(networks), frozenset(hosts)


def _system_resolver(host: str, port: int) -> list[str]:
    """The addresses of ``host``; OSError (socket.gaierror) when it does not resolve now."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except UnicodeError as error:  # a label IDNA cannot encode: no retry will change that
        raise OutboundRefused(f"{host[:80]!r} is not a valid host name: {error}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class OutboundPolicy:
    """Which addresses a webhook may connect to. Built once from the settings; judged per send."""

    allowed_networks: tuple[IPNetwork, ...] = ()
    allowed_hosts: frozenset[str] = frozenset()
    own_endpoints: tuple[tuple[str, int], ...] = ()  # the stack's services: (host, port)
    resolver: Resolver = field(default=_system_resolver, compare=False, repr=False)

    @classmethod
    def from_settings(cls, settings: object) -> OutboundPolicy:
        """The policy of an API's settings: its allow-list, and its own services as refused endpoints."""
        networks, hosts = parse_allow_list(getattr(settings, "webhook_allow", ()))
        event_url = _host_port(getattr(settings, "event_webhook_url", "") or "")
        if event_url:  # the operator's own event sink is trusted as an allow-list entry would be
            hosts = hosts | {event_url[0].lower()}
        own: list[tuple[str, int]] = []
        bind = getattr(settings, "host", "")
        port = getattr(settings, "port", 0)
        if bind and port:
            own.append(("127.0.0.1" if bind in ("0.0.0.0", "::", "") else bind, int(port)))
        for name in ("public_url", "s3_endpoint_url", "cloudwatch_endpoint_url", "sns_endpoint_url", "ray_address",
                     "docker_host", "database_url"):  # fmt: skip
            endpoint = _host_port(str(getattr(settings, name, "") or ""))
            if endpoint:
                own.append(endpoint)
        return cls(networks, hosts, tuple(dict.fromkeys(own)))

    def _allowed(self, host: str, address: IPAddress) -> bool:
        address = _normalise(address)
        return host.rstrip(".").lower() in self.allowed_hosts or any(
            address in network for network in self.allowed_networks if network.version == address.version
        )

    def _own_addresses(self) -> dict[tuple[IPAddress, int], str]:
        """The stack's endpoints as (address, port), resolved now (their containers' addresses change)."""
        own: dict[tuple[IPAddress, int], str] = {}
        for host, port in self.own_endpoints:
            try:
                addresses = self.resolver(host, port)
            except (OSError, OutboundRefused):
                continue  # a service that does not resolve now cannot be reached through its name either
            for text in addresses:
                own[(_normalise(ipaddress.ip_address(text.split("%")[0])), port)] = f"{host}:{port}"
        return own

    def addresses_for(self, host: str, port: int) -> list[str]:
        """The resolved addresses of ``host`` a webhook may connect to; OutboundRefused if any is refused.

        OSError when the name does not resolve now (a DNS fault the caller may retry).

        Every address a name resolves to must pass: a name with one public and one internal record
        is refused rather than left to which record the connection happens to use.
        """
        resolved = self.resolver(host, port)
        if not resolved:
            raise OutboundRefused(f"{host!r} resolves to no address")
        own = self._own_addresses()
        for text in resolved:
            address = ipaddress.ip_address(text)
            service = own.get((_normalise(address), port))
            if service:
                raise OutboundRefused(f"{host}:{port} is the stack's own service {service}: webhooks may not reach it")
            reason = refusal_reason(address)
            if reason and not self._allowed(host, address):
                raise OutboundRefused(
                    f"{host}:{port} resolves to {text}, a {reason} address: webhooks may not reach it "
                    "unless the operator allows it (TRAINGUARD_WEBHOOK_ALLOW)"
                )
        return list(resolved)


def _normalise(address: IPAddress) -> IPAddress:
    """IPv4-mapped IPv6 as its IPv4 address, so ::ffff:10.0.0.5 and 10.0.0.5 compare equal."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address
