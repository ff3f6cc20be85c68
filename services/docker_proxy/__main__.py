"""``python -m trainguard.services.docker_proxy``: serve the restricting Docker API proxy.

Environment (read at start):
    TRAINGUARD_PROXY_LISTEN       host:port to listen on (default 0.0.0.0:2375; keep it on a network
                                  only the control API shares)
    TRAINGUARD_PROXY_SOCKET       the engine's socket (default /var/run/docker.sock)
    TRAINGUARD_PROXY_BIND_ROOTS   comma-separated host directories jobs may bind-mount (default none)
    TRAINGUARD_PROXY_NETWORKS     comma-separated networks job containers may join (default any)
    TRAINGUARD_PROXY_ALLOW_ROOT   1 = do not judge the user (uid 0 and user names pass; default: the
                                  request's User, else the image's USER, must be a non-zero numeric
                                  uid[:gid], in whatever spelling the runtime reads as a number)
"""

from __future__ import annotations

import logging
import os
import sys

from trainguard.services.docker_proxy.rules import ProxyPolicy
from trainguard.services.docker_proxy.server import DockerProxy


def _list(name: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in os.environ.get(name, "").split(",") if item.strip())


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    host, _, port = (os.environ.get("TRAINGUARD_PROXY_LISTEN") or "0.0.0.0:2375").rpartition(":")
    socket_path = os.environ.get("TRAINGUARD_PROXY_SOCKET") or "/var/run/docker.sock"
    policy = ProxyPolicy(
        bind_roots=_list("TRAINGUARD_PROXY_BIND_ROOTS"),
        allowed_networks=_list("TRAINGUARD_PROXY_NETWORKS"),
        refuse_root=os.environ.get("TRAINGUARD_PROXY_ALLOW_ROOT") != "1",
    )
    if "/" in policy.bind_roots:
        print("trainguard docker proxy: '/' cannot be a bind root", file=sys.stderr)
        return 2
    server = DockerProxy((host or "0.0.0.0", int(port)), socket_path, policy)
    logging.getLogger("trainguard.docker_proxy").info(
        "forwarding to %s on %s:%s (bind roots: %s; networks: %s; root containers: %s)", socket_path, host, port,
        ", ".join(policy.bind_roots) or "none", ", ".join(policy.allowed_networks) or "any",
        "refused" if policy.refuse_root else "ALLOWED",
    )  # fmt: skip
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
