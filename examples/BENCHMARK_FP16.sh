#!/usr/bin/env bash
# Part of the ResNet kit (successor of NVIDIA DeepLearningExamples MxNet/Classification/RN50v1.5).
# Usage: examples/BENCHMARK_FP16.sh [benchmark.py/runner flags]   training throughput sweep, float16
# Extra arguments go to the end of the command line, so they can override the settings here.
set -euo pipefail
KIT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python3 "$KIT/benchmark.py" -n 1,4,8 -b 64,128,192,208 --dtype float16 -e 2 -w 1 -i 100 --mode train -o benchmark_fp16.json "$@"
