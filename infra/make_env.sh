#!/usr/bin/env bash
# Write .env for docker compose: fresh random secrets, mode 0600. The stack has no default secret
# and refuses to start without these values. Never overwrites an existing file (pass --force).
#   bash infra/make_env.sh [--force] [PATH]     (default PATH: .env at the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."

force=0
if [ "${1:-}" = "--force" ]; then force=1; shift; fi
target="${1:-.env}"
if [ -e "$target" ] && [ "$force" = 0 ]; then
    echo "[make_env] $target exists; keeping it (--force to replace)" >&2
    exit 0
fi

random() { python3 -c "import secrets, sys; print(secrets.token_urlsafe(int(sys.argv[1])))" "$1"; }
key_id() { python3 -c "import secrets; print('AKTG' + secrets.token_hex(8).upper())"; }

socket="${DOCKER_SOCKET:-/var/run/docker.sock}"
docker_gid="$(stat -c %g "$socket" 2>/dev/null || true)"
if [ -z "$docker_gid" ]; then
    echo "[make_env] $socket not found: set TRAINGUARD_DOCKER_GID in $target by hand" >&2
fi

umask 077
tmp="$(mktemp "${target}.XXXXXX")"
cat >"$tmp" <<ENV
# Made by infra/make_env.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ). Keep it private (mode 0600); never commit it.
# Native API: Authorization: Bearer \$TRAINGUARD_API_TOKEN
TRAINGUARD_API_TOKEN=$(random 32)
# SageMaker clients (boto3): AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY = this pair. More pairs: comma-separated, name=AKID:SECRET.
TRAINGUARD_SAGEMAKER_ACCESS_KEYS=admin=$(key_id):$(random 30)
# Credentials the uploaders and rule runners use for S3 (the local moto endpoint checks none).
AWS_ACCESS_KEY_ID=$(key_id)
AWS_SECRET_ACCESS_KEY=$(random 30)
# Group of the Docker socket: the docker-proxy service (uid 10001) joins it to reach the engine.
TRAINGUARD_DOCKER_GID=${docker_gid}
ENV
chmod 600 "$tmp"
mv "$tmp" "$target"
echo "[make_env] wrote $target (mode 600)" >&2
