#!/usr/bin/env bash
# Part of the ResNet kit (successor of NVIDIA DeepLearningExamples MxNet/Classification/RN50v1.5).
# Usage: examples/RN50_FP16_4.sh [runner/train.py flags]   ResNet-50 v1.5, float16, 4 GPU(s), 208 images per GPU
# Extra arguments go to the end of the command line, so they can override the settings here.
set -euo pipefail
KIT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$KIT/runner" -n 4 -b 208 --dtype float16 --model-prefix model "$@"
