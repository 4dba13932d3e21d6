#!/usr/bin/env bash
# Part of the ResNet kit (successor of NVIDIA DeepLearningExamples MxNet/Classification/RN50v1.5).
# Usage: examples/BENCHMARK_FP32.sh [benchmark.py/runner flags]   training throughput sweep, float32
# Extra arguments go to the end of the command line, so they can override the settings here.
set -euo pipefail
KIT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python3 "$KIT/benchmark.py" -n 1,4,8 -b 32,64,96 --dtype float32 -e 2 -w 1 -i 100 --mode train -o benchmark_fp32.json "$@"
