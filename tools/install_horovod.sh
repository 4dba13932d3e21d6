#!/usr/bin/env bash
# Build Horovod 0.28.1 against the venv's MXNet (with Gloo) once, cache the wheel outside the repo,
# and install it from the cache on every later run. The build takes ~9 minutes on 2 cores.
# Usage: tools/install_horovod.sh PYTHON [CACHE_DIR]
set -euo pipefail
PYTHON=${1:?usage: tools/install_horovod.sh PYTHON [CACHE_DIR]}
CACHE=${2:-${RN50_WHEEL_CACHE:-$HOME/.cache/rn50-kit/wheels}}
HOROVOD_VERSION=0.28.1

# The wheel links against one MXNet build: key the cache on the installed MXNet distribution.
MXNET_DIST=$("$PYTHON" - <<'PY'
import importlib.metadata as md
for dist in md.distributions():
    name = (dist.metadata["Name"] or "").lower()
    if name == "mxnet" or name.startswith("mxnet-"):
        print(f"{name}-{dist.version}")
        break
PY
)
[ -n "$MXNET_DIST" ] || { echo "error: MXNet is not installed in $PYTHON's environment; install it before Horovod" >&2; exit 1; }
WHEEL_DIR="$CACHE/horovod-$HOROVOD_VERSION-$MXNET_DIST-py$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"

if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    echo "Building Horovod $HOROVOD_VERSION for $MXNET_DIST (about 9 minutes on 2 cores, done once; cached in $WHEEL_DIR)"
    mkdir -p "$WHEEL_DIR"
    tmp=$(mktemp -d "$WHEEL_DIR.tmp.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    GPU_FLAGS=()
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && [[ "$MXNET_DIST" == mxnet-cu* ]]; then
        GPU_FLAGS=(HOROVOD_GPU_OPERATIONS=NCCL)
    fi
    env "${GPU_FLAGS[@]}" HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 \
        HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 CMAKE_POLICY_VERSION_MINIMUM=3.5 \
        MAKEFLAGS="-j$(nproc)" \
        "$PYTHON" -m pip wheel --no-build-isolation --no-deps -w "$tmp" "horovod==$HOROVOD_VERSION"
    mv "$tmp"/horovod-*.whl "$WHEEL_DIR"/
fi
"$PYTHON" -m pip install --no-deps --force-reinstall -q "$WHEEL_DIR"/horovod-*.whl
# Horovod's runtime dependencies (kept unpinned by Horovod itself); pinned in setup.py.
