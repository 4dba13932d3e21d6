#!/usr/bin/env bash
# Part of the ResNet kit (successor of NVIDIA DeepLearningExamples MxNet/Classification/RN50v1.5).
# Usage: examples/INFER_BENCHMARK_FP16.sh [benchmark.py/runner flags]   inference throughput and latency, float16, 1 GPU
# Extra arguments go to the end of the command line, so they can override the settings here.
set -euo pipefail
KIT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python3 "$KIT/benchmark.py" -n 1 -b 1,2,4,64,128,192,208 --dtype float16 --only-inference -e 3 -w 1 -i 100 -o infer_benchmark_fp16.json "$@"
