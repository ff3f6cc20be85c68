#!/usr/bin/env bash
# Build the local base image (Debian bookworm + Python 3.11 + venv) where no registry is reachable.
# `docker pull python:3.11-slim` fails on these machines, so the Dockerfiles take BASE_IMAGE as a
# build argument and build_images.sh passes the image made here. Skips all work when the image exists
# (pass --force to rebuild). About 40 s and 300 MB the first time.
set -euo pipefail

IMAGE="${TRAINGUARD_BASE_IMAGE:-trainguard-base:bookworm}"
SUITE="bookworm"
FORCE=0
[ "${1:-}" = "--force" ] && FORCE=1

log() { echo "[build_base_image] $*" >&2; }

if [ "$FORCE" = 0 ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    log "$IMAGE exists"
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    log "debootstrap needs root"; exit 1
fi
if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

# The mirror apt already uses on this machine (deb822 sources or the classic sources.list).
mirror="$(grep -hs -E '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -n 1 || true)"
if [ -z "$mirror" ]; then
    mirror="$(grep -hs -E '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}' | grep -v security | head -n 1 || true)"
fi
mirror="${mirror:-http://deb.debian.org/debian}"

rootfs="$(mktemp -d)"
trap 'rm -rf "$rootfs"' EXIT
log "debootstrap $SUITE from $mirror"
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    "$SUITE" "$rootfs" "$mirror" >/tmp/trainguard-debootstrap.log 2>&1 \
    || { tail -n 30 /tmp/trainguard-debootstrap.log >&2; exit 1; }
# Keep the image small: apt lists and caches are not needed at run time.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    - "$IMAGE" >/dev/null
log "built $IMAGE ($(docker image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%d MB", $1/1e6}'))"
