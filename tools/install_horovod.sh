#!/usr/bin/env bash
# Build Horovod 0.28.1 against the venv's MXNet once, cache the wheel outside the repo, and install it from the
# cache on every later run. The build takes ~9 minutes on 2 cores.
#   Gloo: always (horovodrun's own launcher, single node and over SSH).
#   MPI:  when an MPI implementation is installed (mpicc on PATH): needed by `runner --launcher mpi` and by
#         `--launcher slurm` (srun). Debian/Ubuntu: `apt-get install openmpi-bin libopenmpi-dev`; on a cluster
#         `module load openmpi` (or your site's MPI) before `make setup`. HOROVOD_WITHOUT_MPI=1 forces it off.
#   NCCL: when the installed MXNet is a CUDA build (mx.runtime.Features), so GPU allreduce runs on NCCL.
# The cache key names each choice: a Gloo-only wheel is never reused for an MPI or NCCL build, or the reverse.
# Usage: tools/install_horovod.sh PYTHON [CACHE_DIR]
#        tools/install_horovod.sh --features PYTHON   (what `horovodrun --check-build` must list for this set-up)
set -euo pipefail
HOROVOD_VERSION=0.28.1

mxnet_dist() {  # the installed MXNet distribution, e.g. mxnet-1.9.1 or mxnet-cu112-1.9.1
    "$PYTHON" - <<'PY'
import importlib.metadata as md
for dist in md.distributions():
    name = (dist.metadata["Name"] or "").lower()
    if name == "mxnet" or name.startswith("mxnet-"):
        print(f"{name}-{dist.version}")
        break
PY
}

mxnet_has_cuda() {  # from the library itself, not from the machine: a CPU MXNet on a GPU machine gets no NCCL
    "$PYTHON" -c 'import mxnet; raise SystemExit(0 if mxnet.runtime.Features().is_enabled("CUDA") else 1)'
}

mpi_tag() {  # empty without MPI; else the implementation, e.g. openmpi-4.1.4 (the wheel links its libmpi)
    if [ "${HOROVOD_WITHOUT_MPI:-0}" = 1 ] || ! command -v mpicc >/dev/null 2>&1; then
        return
    fi
    local version
    version=$(mpicc -showme:version 2>/dev/null | sed -n 's/.*Open MPI \([0-9.]*\).*/\1/p')
    if [ -n "$version" ]; then
        echo "openmpi-$version"
    else  # MPICH, Intel MPI, ...: key on how mpicc compiles and links
        echo "mpi-$(mpicc -show 2>/dev/null | cksum | cut -d' ' -f1)"
    fi
}

if [ "${1:-}" = --features ]; then
    PYTHON=${2:?usage: tools/install_horovod.sh --features PYTHON}
    echo MXNet Gloo
    [ -z "$(mpi_tag)" ] || echo MPI
    if mxnet_has_cuda; then echo NCCL; fi
    exit 0
fi

PYTHON=${1:?usage: tools/install_horovod.sh PYTHON [CACHE_DIR]}
CACHE=${2:-${RN50_WHEEL_CACHE:-$HOME/.cache/rn50-kit/wheels}}

MXNET_DIST=$(mxnet_dist)
[ -n "$MXNET_DIST" ] || { echo "error: MXNet is not installed in $PYTHON's environment; install it before Horovod" >&2; exit 1; }
"$PYTHON" -c 'import mxnet' \
    || { echo "error: $MXNET_DIST is installed but does not import (see above); fix it before building Horovod" >&2; exit 1; }
MPI_TAG=$(mpi_tag)
FLAGS=(HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITH_GLOO=1)
KEY="horovod-$HOROVOD_VERSION-$MXNET_DIST-py$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
if [ -n "$MPI_TAG" ]; then
    FLAGS+=(HOROVOD_WITH_MPI=1)
    KEY+="-$MPI_TAG"
else
    FLAGS+=(HOROVOD_WITHOUT_MPI=1)
fi
if mxnet_has_cuda; then
    # Horovod finds CUDA and NCCL through HOROVOD_CUDA_HOME / HOROVOD_NCCL_HOME (defaults /usr/local/cuda, system
    # paths); a missing nccl.h fails the build here rather than leaving GPU allreduce on the CPU.
    FLAGS+=(HOROVOD_GPU_OPERATIONS=NCCL)
    KEY+="-nccl"
fi
WHEEL_DIR="$CACHE/$KEY"

if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    echo "Building Horovod $HOROVOD_VERSION for $MXNET_DIST with ${FLAGS[*]}"
    echo "(about 9 minutes on 2 cores, done once; cached in $WHEEL_DIR)"
    mkdir -p "$WHEEL_DIR"
    # --no-cache-dir: pip's own wheel cache keys on the source only and would hand back a wheel built with
    # other flags (seen: a Gloo-only wheel reused for an MPI build).
    tmp=$(mktemp -d "$WHEEL_DIR.tmp.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    env "${FLAGS[@]}" CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" \
        "$PYTHON" -m pip wheel --no-build-isolation --no-deps --no-cache-dir -w "$tmp" "horovod==$HOROVOD_VERSION"
    mv "$tmp"/horovod-*.whl "$WHEEL_DIR"/
fi
"$PYTHON" -m pip install --no-deps --force-reinstall -q "$WHEEL_DIR"/horovod-*.whl
# Horovod's runtime dependencies (kept unpinned by Horovod itself); pinned in setup.py.
