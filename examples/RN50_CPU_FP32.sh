#!/usr/bin/env bash
# Part of the ResNet kit (successor of NVIDIA DeepLearningExamples MxNet/Classification/RN50v1.5).
# Usage: examples/RN50_CPU_FP32.sh [runner/train.py flags]   ResNet-50 v1.5 on a machine without GPUs, float32, 1 worker using every core
# Extra arguments go to the end of the command line, so they can override the settings here.
set -euo pipefail
KIT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$KIT/runner" -n 1 -b 32 --dtype float32 --data-backend dali-cpu --model-prefix model "$@"
