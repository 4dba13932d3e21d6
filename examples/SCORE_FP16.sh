#!/usr/bin/env bash
# Part of the ResNet kit (successor of NVIDIA DeepLearningExamples MxNet/Classification/RN50v1.5).
# Usage: examples/SCORE_FP16.sh PREFIX EPOCH [runner/train.py flags]
#   Scores the checkpoint PREFIX-NNNN.params (epoch EPOCH, e.g. runs/demo/model 16) on the validation set
#   (--data-root/val.rec): top-1, top-5, images/s and latency percentiles, float16, 1 worker, batch 128.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
score_checkpoint float16 128 "$@"
