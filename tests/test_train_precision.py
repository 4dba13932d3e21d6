"""--dtype bfloat16 really trains in bfloat16 (MXNet AMP on oneDNN), close to float32 but not equal."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, venv_env


def train_losses(tmp_path, dtype):
    workspace = tmp_path / dtype
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--kv-store", "local", "--dtype", dtype,
               "--data-backend", "synthetic", "--mode", "train", "--num-layers", "18", "--num-classes", "10",
               "--image-shape", "3,32,32", "--batch-size", "8", "--num-epochs", "2", "--num-examples", "32",
               "--lr", "0.05", "--warmup-epochs", "0", "--seed", "7", "--workspace", str(workspace)]
    result = subprocess.run(command, env=venv_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(workspace / "report.json") as f:
        return json.load(f)["metrics"]["train.loss"]


def test_bfloat16_training_differs_from_float32_only_by_rounding(tmp_path):
    import quantize
    why = quantize.bfloat16_unavailable()
    if why and not os.environ.get("CI"):
        pytest.skip(why)
    float32 = train_losses(tmp_path, "float32")
    bfloat16 = train_losses(tmp_path, "bfloat16")
    assert len(float32) == len(bfloat16) == 2
    assert float32 != bfloat16  # the same seed and data: any difference comes from bfloat16 arithmetic
    for a, b in zip(float32, bfloat16):
        assert abs(a - b) <= 0.05 * abs(a), (float32, bfloat16)
