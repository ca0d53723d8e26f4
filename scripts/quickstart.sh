#!/usr/bin/env bash
# One command from a fresh Debian/Ubuntu machine (as root) to a passing example run:
# installs the container engines and uv, syncs this checkout, creates ./example-env from the
# `default` template, builds its image (the base image first, from Debian packages) and runs
# `example-task` with the scripted fake model in a Docker sandbox.
#
#   sudo bash scripts/quickstart.sh [ENV_DIR] [RUNTIME]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
env_dir="${1:-$repo/example-env}"
runtime="${2:-docker}"

if [ "$(id -u)" -ne 0 ]; then
    echo "quickstart: run as root (it installs packages and starts dockerd)" >&2
    exit 2
fi

echo "== container engines"
bash "$repo/scripts/setup-engines.sh"

echo "== uv"
command -v uv >/dev/null || python3 -m pip install --quiet "uv==0.13.8"

echo "== karotte"
(cd "$repo" && uv sync --frozen --quiet)

if [ ! -e "$env_dir/.manifest.json" ]; then
    echo "== create-env $env_dir"
    (cd "$repo" && uv run karotte create-env "$env_dir")
fi

echo "== environment venv"
cd "$env_dir"
uv sync --extra dev --quiet
uv run setup_data.py

echo "== run example-task with the fake model in a $runtime sandbox (builds the image first)"
uv run karotte run --task example-task --fake-model --runtime "$runtime"
echo "== done: see $env_dir/out/transcript.json"
