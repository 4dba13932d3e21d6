#!/usr/bin/env bash
# The kit inside NVIDIA's MXNet container (`make setup-container`; the Dockerfile runs it too): keep the container's
# MXNet (NVIDIA's build: sm_90 kernels, fused BatchNorm), numpy, Horovod and Open MPI; install only what the kit
# adds (DALI 2.4, OpenCV, the TOML, safetensors, plotting, MLPerf-log and TensorBoard-writer packages) and the kit
# itself; never build Horovod. Every pip install is constrained to the versions found, so pip fails rather than
# replace one; the versions are compared again at the end. Ends with tools/check_environment.py's table.
# Usage: tools/setup_container.sh [PYTHON] [--with-tests]   (PYTHON: the container's, default `python`;
#        --with-tests: also the test packages, for the kit's own CI)
set -euo pipefail
KIT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=python
WITH_TESTS=0
for arg in "$@"; do
    case "$arg" in
        --with-tests) WITH_TESTS=1 ;;
        -*) echo "setup_container: error: unknown option $arg (usage: tools/setup_container.sh [PYTHON] [--with-tests])" >&2; exit 2 ;;
        *) PYTHON=$arg ;;
    esac
done
command -v "$PYTHON" >/dev/null || { echo "setup_container: error: no Python named $PYTHON; give the container's, e.g. tools/setup_container.sh python3" >&2; exit 2; }

# One line and no change where the container cannot run the kit: a Python outside 3.10-3.11, MXNet older than
# 1.9, or a Horovod without MXNet.
"$PYTHON" - "$KIT" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from rn50kit.common import supported
supported.require_supported_python("setup_container")
try:
    import mxnet
except Exception as error:
    sys.exit(f"setup_container: error: the container's MXNet does not import ({error}); this set-up keeps the "
             "container's MXNet: use NVIDIA's MXNet container, or `make setup` outside one")
if supported.mxnet_problem(mxnet.__version__):
    sys.exit(f"setup_container: error: {supported.mxnet_problem(mxnet.__version__)}")
from rn50kit.launch.horovod_build import horovod_build
problem = supported.horovod_problem(horovod_build())
if problem:
    sys.exit(f"setup_container: error: {problem}")
PY

keep=$(mktemp)
adds=$(mktemp)
trap 'rm -f "$keep" "$adds"' EXIT
"$PYTHON" "$KIT/tools/check_environment.py" --keep > "$keep"
before=$(cat "$keep")
echo "setup_container: keeping the container's" $before

# requirements.txt less what the container brings: numpy, and Horovod's runtime packages (cloudpickle, psutil,
# PyYAML, packaging, cffi) which its Horovod already has.
grep -vE '^(numpy|cloudpickle|psutil|PyYAML|packaging|cffi)==' "$KIT/requirements.txt" > "$adds"
"$PYTHON" -m pip install -q -c "$keep" -r "$adds"
"$PYTHON" -m pip install -q -c "$keep" --no-deps --no-build-isolation -e "$KIT"
if [ "$WITH_TESTS" = 1 ]; then
    "$PYTHON" -m pip install -q -c "$keep" -e "$KIT[test]"
fi

after=$("$PYTHON" "$KIT/tools/check_environment.py" --keep)
if [ "$before" != "$after" ]; then
    echo "setup_container: error: the container's packages changed (before: $before; after: $after)" >&2
    exit 1
fi
"$PYTHON" "$KIT/tools/check_environment.py"
echo "setup_container: done; next: python tools/gpu_check.py (the self-check, docs/gpu.md)"
