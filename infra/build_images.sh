#!/usr/bin/env bash
# Build the stack's images: trainguard-training:local and trainguard-service:local.
#   1. the base image (infra/build_base_image.sh) unless BASE_IMAGE names another one;
#   2. a wheelhouse on the host under build/wheelhouse/ (pip inside `docker build` cannot reach an
#      index here: the proxy's CA is trusted only by the host), one folder per layer group;
#   3. `docker build --build-arg BASE_IMAGE=...` for both Dockerfiles (context: the repository root).
# Re-runs are fast: each wheelhouse group is rebuilt only when its requirements (or, for the
# trainguard wheel, the source) change, and docker's layer cache does the rest.
# Elsewhere, with a registry: BASE_IMAGE=python:3.11-slim bash infra/build_images.sh
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_IMAGE="${BASE_IMAGE:-}"
WHEELHOUSE="build/wheelhouse"
TRAINING_IMAGE="${TRAINGUARD_TRAINING_IMAGE:-trainguard-training:local}"
SERVICE_IMAGE="${TRAINGUARD_SERVICE_IMAGE:-trainguard-service:local}"

log() { echo "[build_images] $*" >&2; }

if [ -z "$BASE_IMAGE" ]; then
    bash infra/build_base_image.sh
    BASE_IMAGE="${TRAINGUARD_BASE_IMAGE:-trainguard-base:bookworm}"
fi

# One requirement list per layer group; the common group is shared by both images.
declare -A GROUPS_REQUIREMENTS=(
    [common]='numpy>=1.22
protobuf>=4.21
boto3>=1.28'
    # NEVER torch without the exact pin: unpinned, pip picks the newest build with GBs of CUDA.
    # sagemaker-training: the toolkit that runs SageMaker SDK jobs' entry points (sagemaker_program).
    [torch]='torch==2.13.0
sagemaker-training>=4'
    [service]='fastapi>=0.110
uvicorn>=0.27
sqlalchemy>=2.0
docker>=7,<8
moto[server]>=5.0
pyyaml>=6
google-re2>=1.1'
)

fill_group() {
    local group="$1" requirements="$2" dir="$WHEELHOUSE/$1"
    local stamp
    stamp="$(printf '%s' "$requirements" | sha256sum | cut -c1-16)"
    if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp" ]; then
        return
    fi
    log "wheelhouse/$group: pip wheel $(echo "$requirements" | tr '\n' ' ')"
    rm -rf "$dir" && mkdir -p "$dir"
    printf '%s\n' "$requirements" >"$dir/requirements.txt"
    # (pip's notes about find-links folders absent on this machine are noise: filter them out)
    python3 -m pip wheel --quiet --disable-pip-version-check -w "$dir" -r "$dir/requirements.txt" \
        2> >(grep -v "^WARNING: Location 'file:" >&2)
    echo "$stamp" >"$dir/.stamp"
}

for group in common torch service; do
    fill_group "$group" "${GROUPS_REQUIREMENTS[$group]}"
done
# The common group's wheels are installed in both images before the rest; drop them from the
# other groups so each layer holds only what it adds.
for group in torch service; do
    for wheel in "$WHEELHOUSE"/common/*.whl; do
        rm -f "$WHEELHOUSE/$group/$(basename "$wheel")"
    done
done

# trainguard itself: rebuilt when the source changes (infra/build_app_wheel.sh: reproducible bytes,
# and no need for the `wheel` package or any setuptools on this machine).
app_stamp="$( (find src services -type f -not -path '*__pycache__*' -not -name '*.pyc' | LC_ALL=C sort | xargs sha256sum; sha256sum pyproject.toml setup.py) | sha256sum | cut -c1-16)"
if [ ! -f "$WHEELHOUSE/app/.stamp" ] || [ "$(cat "$WHEELHOUSE/app/.stamp")" != "$app_stamp" ]; then
    log "wheelhouse/app: trainguard wheel"
    rm -rf "$WHEELHOUSE/app" && mkdir -p "$WHEELHOUSE/app"
    bash infra/build_app_wheel.sh "$WHEELHOUSE/app"
    echo "$app_stamp" >"$WHEELHOUSE/app/.stamp"
fi

build() {
    local image="$1" dockerfile="$2" start
    start=$(date +%s)
    docker build --quiet --build-arg BASE_IMAGE="$BASE_IMAGE" -f "$dockerfile" -t "$image" . >/dev/null 2>build/docker-build.log \
        || { cat build/docker-build.log >&2; log "docker build of $image failed"; exit 1; }
    log "$image ready ($(( $(date +%s) - start )) s)"
}
build "$SERVICE_IMAGE" containers/rules/Dockerfile
build "$TRAINING_IMAGE" containers/training/Dockerfile
