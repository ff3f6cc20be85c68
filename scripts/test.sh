#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh machine, then runs them all.
# README's second command; .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install --quiet --disable-pip-version-check torch==2.13.0
python -m pip install --quiet --disable-pip-version-check -e '.[test]'
# The project's own lint settings (pyproject.toml [tool.ruff]) over the code that ships.
python -m ruff check src services
python -m mypy  # src/trainguard and services/, the settings in pyproject.toml [tool.mypy]
# System packages some tests drive for real: headless Chromium renders the HTML report, a
# PostgreSQL server backs the API's Postgres test. Installed where we may (root, as in CI);
# elsewhere those tests skip and say why.
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    missing=""
    command -v chromium >/dev/null || missing="$missing chromium chromium-driver"
    [ -n "$(ls /usr/lib/postgresql/*/bin/postgres 2>/dev/null)" ] || missing="$missing postgresql"
    if [ -n "$missing" ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
    fi
fi
# The interop tests and the benchmark run the real smdebug 1.0.34 in its own venv (it needs
# numpy<2 and protobuf 3.20); build it once up front so its build time is not a test's.
python tests/interop/smdebug_env.py
# The Docker end-to-end tests (tests/e2e) need the engine, Compose v2 and the stack's images: set
# them up where we may (root, as in CI); elsewhere those tests skip and say why.
if [ "$(id -u)" = "0" ] || [ "${CI:-}" = "true" ]; then
    bash infra/setup_docker.sh
    bash infra/build_images.sh
fi
python -m pytest -q -p no:cacheprovider "$@"
