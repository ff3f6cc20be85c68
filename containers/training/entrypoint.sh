#!/bin/bash
# Run the user's command under trainguard's zero-code capture:
#   entrypoint.sh python train.py ...  ->  trainguard run --out DIR [--config FILE] -- python train.py ...
# Environment:
#   TRAINGUARD_OUT_DIR            where the run is written (default /opt/ml/output/tensors: the job's
#                                 tensor volume, which the uploader container follows)
#   TRAINGUARD_HOOK_CONFIG_JSON   optional SageMaker DebugHookConfig JSON
#   TRAINGUARD_RULES              optional rule specs, passed as --rules where `trainguard run` has it
#   TRAINGUARD_PROFILER_CONFIG_JSON  optional SageMaker ProfilerConfig JSON: unless DisableProfiler,
#                                 adds --profile [--profile-interval-ms ProfilingIntervalInMilliseconds]
# `trainguard run` forwards SIGTERM/SIGINT to the training process, so `docker stop` reaches it.
set -euo pipefail

if [ "$#" -eq 0 ]; then
    echo "trainguard-training: no command given (e.g. python train.py)" >&2
    exit 64
fi

out_dir="${TRAINGUARD_OUT_DIR:-/opt/ml/output/tensors}"
mkdir -p "$out_dir"
options=(--out "$out_dir")

if [ -n "${TRAINGUARD_HOOK_CONFIG_JSON:-}" ]; then
    config_file="$(mktemp /tmp/debughookconfig.XXXXXX.json)"
    printf '%s' "$TRAINGUARD_HOOK_CONFIG_JSON" >"$config_file"
    options+=(--config "$config_file")
fi
if [ -n "${TRAINGUARD_RULES:-}" ] && trainguard run --help 2>/dev/null | grep -q -- '--rules'; then
    options+=(--rules "$TRAINGUARD_RULES")
fi
if [ -n "${TRAINGUARD_PROFILER_CONFIG_JSON:-}" ]; then
    # Prints nothing (profiler disabled), "on", or the sampling interval in ms.
    profiler="$(python - <<'PY' 2>/dev/null || true
import json, os
config = json.loads(os.environ["TRAINGUARD_PROFILER_CONFIG_JSON"])
if not config.get("DisableProfiler"):
    print(config.get("ProfilingIntervalInMilliseconds") or "on")
PY
)"
    if [ -n "$profiler" ] && trainguard run --help 2>/dev/null | grep -q -- '--profile'; then
        options+=(--profile)
        [ "$profiler" != "on" ] && options+=(--profile-interval-ms "$profiler")
    fi
fi
exec trainguard run "${options[@]}" -- "$@"
