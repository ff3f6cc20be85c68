#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh machine, then runs them all.
# README's second command; .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install --quiet --disable-pip-version-check torch==2.13.0
python -m pip install --quiet --disable-pip-version-check -e '.[test]'
# The interop tests and the benchmark run the real smdebug 1.0.34 in its own venv (it needs
# numpy<2 and protobuf 3.20); build it once up front so its build time is not a test's.
python tests/interop/smdebug_env.py
# The Docker end-to-end tests (tests/e2e) need the engine, Compose v2 and the stack's images: set
# them up where we may (root, as in CI); elsewhere those tests skip and say why.
if [ "$(id -u)" = "0" ] || [ "${CI:-}" = "true" ]; then
    python -m pip install --quiet --disable-pip-version-check 'docker>=7,<8'
    bash infra/setup_docker.sh
    bash infra/build_images.sh
fi
python -m pytest -q -p no:cacheprovider "$@"
