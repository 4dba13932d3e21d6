#!/usr/bin/env bash
# Part of the ResNet kit (successor of NVIDIA DeepLearningExamples MxNet/Classification/RN50v1.5).
# Usage: examples/SCORE_INT8.sh PREFIX EPOCH [runner/train.py flags]
#   Scores the float32 checkpoint PREFIX-NNNN.params quantized to INT8 with oneDNN (CPU), calibrated on 10
#   batches of --data-root/train.rec (--calib-batches/--calib-mode to change), on --data-root/val.rec: top-1,
#   top-5, images/s and latency percentiles, 1 worker, batch 64. The INT8 graph is saved beside the checkpoint.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
score_checkpoint int8 64 "$@"
