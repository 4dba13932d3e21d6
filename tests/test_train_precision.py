"""--dtype bfloat16 really trains in bfloat16 (MXNet AMP on oneDNN), close to float32 but not equal."""
import json
import os
import subprocess
import sys

import pytest

from conftest import HANG_S, ROOT, venv_env

pytestmark = pytest.mark.slow  # launches processes or trains end to end


def train_losses(tmp_path, dtype):
    workspace = tmp_path / dtype
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--kv-store", "local", "--dtype", dtype,
               "--data-backend", "synthetic", "--mode", "train", "--num-layers", "18", "--num-classes", "10",
               "--image-shape", "3,32,32", "--batch-size", "8", "--num-epochs", "2", "--num-examples", "32",
               "--lr", "0.05", "--warmup-epochs", "0", "--seed", "7", "--workspace", str(workspace)]
    result = subprocess.run(command, env=venv_env(), capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(workspace / "report.json") as f:
        return json.load(f)["metrics"]["train.loss"]


BFLOAT16_CONVOLUTION = """
from mxnet.contrib import amp
amp.init(target_dtype="bfloat16")
import mxnet as mx
net = mx.gluon.nn.Conv2D(4, 3)
net.initialize()
net.hybridize()
print(net(mx.nd.ones((1, 3, 8, 8))).asnumpy().sum())
"""


def test_bfloat16_trains_close_to_float32_or_is_refused_where_onednn_cannot_run_it(tmp_path):
    """With AVX-512: bfloat16 really trains, close to float32 but not equal. Without: the user gets one line before
    any work, and the refusal is needed: MXNet's own bfloat16 convolution fails there (checked, not assumed)."""
    from rn50kit.config import settings
    if settings.bfloat16_unsupported():
        plain = subprocess.run([sys.executable, "-c", BFLOAT16_CONVOLUTION], env=venv_env(), capture_output=True,
                               text=True, timeout=HANG_S)
        assert plain.returncode != 0 and "primitive descriptor" in plain.stderr, plain.stderr[-2000:]
        command = [sys.executable, os.path.join(ROOT, "train.py"), "--kv-store", "local", "--dtype", "bfloat16",
                   "--data-backend", "synthetic", "--mode", "train", "--num-layers", "18", "--num-classes", "10",
                   "--image-shape", "3,32,32", "--batch-size", "8", "--num-epochs", "1", "--num-examples", "16",
                   "--workspace", str(tmp_path / "bf16")]
        result = subprocess.run(command, env=venv_env(), capture_output=True, text=True, timeout=HANG_S)
        assert result.returncode == 2, result.stderr[-3000:]
        assert "Traceback" not in result.stderr and "AVX-512" in result.stderr
        assert not (tmp_path / "bf16" / "report.json").exists()
        return
    float32 = train_losses(tmp_path, "float32")
    bfloat16 = train_losses(tmp_path, "bfloat16")
    assert len(float32) == len(bfloat16) == 2
    assert float32 != bfloat16  # the same seed and data: any difference comes from bfloat16 arithmetic
    for a, b in zip(float32, bfloat16):
        assert abs(a - b) <= 0.05 * abs(a), (float32, bfloat16)
