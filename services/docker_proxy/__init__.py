"""A restricting Docker API proxy: the control API talks to it instead of holding the Docker socket.

The API container gets ``DOCKER_HOST=tcp://docker-proxy:2375`` on a network only the two share;
the proxy alone mounts ``/var/run/docker.sock``. It forwards only what the docker launcher needs
(create, start, stop, kill, restart, wait, inspect, logs, remove containers; create, list, inspect,
remove volumes; inspect networks; ping and version), only for objects labelled ``trainguard.job``,
and refuses any container that would weaken isolation (see :mod:`.rules`). What it forwards is
rebuilt from what it judged (:mod:`.container_spec`, :mod:`.queries`), never the client's bytes,
reading keys as the engine's Go decoder does (:mod:`.gojson`) and users as the runtime does
(:mod:`.users`).
"""

from trainguard.services.docker_proxy.rules import ProxyPolicy, Refused

__all__ = ["ProxyPolicy", "Refused"]
