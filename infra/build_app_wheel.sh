#!/usr/bin/env bash
# Build trainguard's own wheel (core library + services) into DIR: bash infra/build_app_wheel.sh DIR
# With pip's build isolation: pip installs the build backend pyproject.toml names (setuptools, and
# `wheel` where that setuptools still needs it) into a throw-away environment, so this works with
# whatever the Python running it has or lacks (PYTHON, default python3). SOURCE_DATE_EPOCH makes
# the wheel's bytes reproducible, so an unchanged source keeps docker's cached layer.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bash infra/build_app_wheel.sh DIR}"
python="${PYTHON:-python3}"
mkdir -p "$out"
# (pip's notes about find-links folders absent on this machine are noise: filter them out)
SOURCE_DATE_EPOCH=315532800 "$python" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$out" . \
    2> >(grep -v "^WARNING: Location 'file:" >&2) >/dev/null
rm -rf build/lib build/bdist.* src/*.egg-info 2>/dev/null || true
ls "$out"/trainguard-*.whl >/dev/null
