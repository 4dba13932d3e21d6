#!/usr/bin/env bash
# Part of the ResNet kit (successor of NVIDIA DeepLearningExamples MxNet/Classification/RN50v1.5).
# Usage: examples/SCORE_FP16.sh PREFIX EPOCH [runner/train.py flags]
#   Scores the checkpoint PREFIX-NNNN.params (epoch EPOCH, e.g. runs/demo/model 16) on the validation set
#   (--data-root/val.rec): top-1, top-5, images/s and latency percentiles, float16, 1 worker, batch 128.
set -euo pipefail
KIT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ $# -lt 2 ] || ! [[ $2 =~ ^[0-9]+$ ]]; then
    echo "SCORE_FP16.sh: error: expected PREFIX EPOCH (e.g. runs/demo/model 16), then optional runner flags" >&2
    exit 2
fi
PREFIX=$1
EPOCH=$(printf %04d "$((10#$2))")
shift 2
PARAMS=""
for candidate in "$PREFIX-$EPOCH.params" "${PREFIX}_$EPOCH.params"; do
    if [ -f "$candidate" ]; then PARAMS=$candidate; break; fi
done
if [ -z "$PARAMS" ]; then
    echo "SCORE_FP16.sh: error: no checkpoint $PREFIX-$EPOCH.params; give the prefix and epoch of a saved one" >&2
    exit 2
fi
"$KIT/runner" -n 1 -b 128 --dtype float16 --mode val --load "$PARAMS" -e 1 "$@"
