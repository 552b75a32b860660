#!/usr/bin/env bash
# Creates the Python venv for the integration tests' worker agent.
#
#   tests/workers/setup-venv.sh [VENV_DIR]     (default: <workspace>/target/pyvenv)
#
# Idempotent and safe to run concurrently (flock on VENV_DIR.lock): a stamp file in the venv holds the sha256 of requirements.txt
# (and the interpreter version); when it matches, the script exits at once.
# Otherwise the venv is (re)built from scratch with `python3 -m venv` and
# `pip install -r requirements.txt`. Needs python3 (>= 3.10) and PyPI access.
# PYTHON=/path/to/python3 picks another interpreter.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
workspace="$(cd "$here/../.." && pwd)"
venv="${1:-$workspace/target/pyvenv}"
req="$here/requirements.txt"
python="${PYTHON:-python3}"

if ! command -v "$python" >/dev/null 2>&1; then
    echo "setup-venv: $python not found; install python3 (>= 3.10)" >&2
    exit 1
fi

want="$(
    {
        sha256sum "$req" | cut -d' ' -f1
        "$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])'
    } | tr '\n' ' '
)"
stamp="$venv/.a2a-gateway-requirements"

ready() { [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$venv/bin/python" ]]; }
ready && exit 0

# Two test processes may get here at once: build under a lock, then re-check.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi
ready && exit 0

echo "setup-venv: building $venv from $req" >&2
rm -rf "$venv"

# Debian splits ensurepip into python3-venv; without it `-m venv` fails, so
# fall back to a venv without pip and drive the system pip into it.
if "$python" -m venv "$venv" >/dev/null 2>&1 && [[ -x "$venv/bin/pip" ]]; then
    pip=("$venv/bin/python" -m pip)
else
    echo "setup-venv: no ensurepip; using the system pip with --python" >&2
    rm -rf "$venv"
    "$python" -m venv --without-pip "$venv"
    pip=("$python" -m pip --python "$venv/bin/python")
fi

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
"${pip[@]}" install --quiet -r "$req"
"$venv/bin/python" -c 'import a2a.server.routes, uvicorn, sse_starlette, grpc, hypercorn.asyncio
from a2a.server.request_handlers import GrpcHandler'

echo "$want" >"$stamp"
echo "setup-venv: ready at $venv" >&2
