"""--dtype int8: a checkpoint trained on the real digits scores in INT8 (oneDNN) close to its float32 score; the
quantized graph is saved, reused, and not reused for another calibration; training in int8 is refused. The same
checkpoint scored through oneDNN's fused bfloat16 graph (models.to_bfloat16) is as close."""
import glob
import json
import os
import subprocess
import sys

import pytest

from rn50kit.scoring import quantize
from support.processes import HANG_S, LONG_HANG_S, ROOT, venv_env
from support.runs import digits_run

pytestmark = pytest.mark.slow  # launches processes or trains end to end


EPOCHS = 4


# The digits validation set has 359 images, so 0.5 points is 1.8 images. On this AVX2 machine (no VNNI) the
# INT8 graph of the tiny 4-epoch network moves a few borderline images either way; the 0.5 points is
# checked as "at most 2 images" (0.56 points), and agreement with float32's predictions is checked on its own.
MAX_TOP1_GAP = 2 / 359 + 1e-9


def missing_int8():
    import mxnet as mx
    return quantize.int8_unavailable("val", [mx.cpu()], "NCHW", 1)


@pytest.fixture(autouse=True)
def needs_int8():
    why = missing_int8()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run INT8: {why}")
        pytest.skip(why)


def command(digits, workspace, *extra):
    return [sys.executable, os.path.join(ROOT, "train.py"), "--kv-store", "local", *digits_run(digits),
            "--batch-size", "32", "--num-epochs", str(EPOCHS), "--lr", "0.1", "--warmup-epochs", "1",
            "--num-examples", "1280", "--seed", "3", "--workspace", str(workspace), *extra]


def run(cmd):
    return subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=LONG_HANG_S)


def score(digits, workspace, dtype, report, *extra):
    result = run(command(digits, workspace, "--mode", "val", "--num-epochs", "1", "--dtype", dtype,
                         "--report", report, *extra))
    assert result.returncode == 0, result.stderr[-3000:]
    with open(os.path.join(workspace, report)) as f:
        return json.load(f), result.stderr


@pytest.fixture(scope="module")
def trained(digits_data, tmp_path_factory):
    workspace = tmp_path_factory.mktemp("int8")
    result = run(command(digits_data, workspace, "--mode", "train"))
    assert result.returncode == 0, result.stderr[-3000:]
    return workspace


def test_int8_top1_close_to_float32_and_graph_reused(trained, digits_data):
    float32, _ = score(digits_data, trained, "float32", "fp32.json")
    int8, log = score(digits_data, trained, "int8", "int8.json", "--calib-batches", "4")
    top1_fp32, top1_int8 = float32["metrics"]["val.top1"][0], int8["metrics"]["val.top1"][0]
    assert top1_fp32 > 0.5, top1_fp32  # a network that learnt something: the comparison means something
    assert abs(top1_int8 - top1_fp32) <= MAX_TOP1_GAP, (top1_fp32, top1_int8)
    calibration = int8["info"]["int8"]
    assert calibration["mode"] == "naive" and calibration["records"] == 4 * 32 and not calibration["reused"]
    assert calibration["data"].startswith(os.path.abspath(f"{digits_data}/train.rec"))
    graphs = glob.glob(str(trained / f"model-{EPOCHS:04d}.int8-*-symbol.json"))
    assert graphs == [calibration["graph"]], graphs
    assert "naive calibration on 128 training records" in log

    again, log = score(digits_data, trained, "int8", "int8-again.json", "--calib-batches", "4")
    assert again["info"]["int8"]["reused"] and again["info"]["int8"]["graph"] == calibration["graph"]
    assert again["metrics"]["val.top1"] == int8["metrics"]["val.top1"]
    assert "reused from" in log

    other, _ = score(digits_data, trained, "int8", "int8-other.json", "--calib-batches", "2")
    assert not other["info"]["int8"]["reused"] and other["info"]["int8"]["records"] == 64
    assert len(glob.glob(str(trained / f"model-{EPOCHS:04d}.int8-*-symbol.json"))) == 2


def test_bfloat16_fused_top1_close_to_float32(trained, digits_data):
    """One worker scores --dtype bfloat16 through oneDNN's fused bfloat16 graph; where the CPU has no bfloat16
    kernels the run is refused in one line instead."""
    from rn50kit.config import settings
    missing = settings.bfloat16_unsupported()
    if missing:
        result = run(command(digits_data, trained, "--mode", "val", "--num-epochs", "1", "--dtype", "bfloat16",
                             "--report", "bf16.json"))
        errors = [line for line in result.stderr.splitlines() if "error:" in line]
        assert result.returncode == 2 and len(errors) == 1 and "AVX-512" in errors[0], result.stderr[-2000:]
        return
    float32, _ = score(digits_data, trained, "float32", "fp32-for-bf16.json")
    bfloat16, _ = score(digits_data, trained, "bfloat16", "bf16.json")
    top1_fp32, top1_bf16 = float32["metrics"]["val.top1"][0], bfloat16["metrics"]["val.top1"][0]
    assert top1_fp32 > 0.5, top1_fp32
    assert abs(top1_bf16 - top1_fp32) <= MAX_TOP1_GAP, (top1_fp32, top1_bf16)
    loss_fp32, loss_bf16 = float32["metrics"]["val.loss"][0], bfloat16["metrics"]["val.loss"][0]
    assert loss_bf16 != loss_fp32 and abs(loss_bf16 - loss_fp32) <= 0.02 * loss_fp32, (loss_fp32, loss_bf16)


def test_int8_prediction_matches_float32(trained, digits_data):
    image = sorted(glob.glob(f"{digits_data}/raw/val/7/*.jpg"))[0]
    tops = {}
    for dtype in ("float32", "int8"):
        result = run(command(digits_data, trained, "--mode", "pred", "--dtype", dtype, "--data-pred", image,
                             "--calib-batches", "4"))
        assert result.returncode == 0, result.stderr[-3000:]
        tops[dtype] = [line.split("->")[-1].strip() for line in result.stdout.splitlines() if "->" in line]
    assert len(tops["int8"]) == 5 and tops["int8"][0] == tops["float32"][0], tops


def test_int8_training_is_refused_in_one_line(digits_data, tmp_path):
    result = run(command(digits_data, tmp_path, "--mode", "train", "--dtype", "int8"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("train.py: error: --dtype int8 scores and predicts only")
    assert not os.listdir(tmp_path)


def test_int8_needs_an_int8_capable_cpu():
    import mxnet as mx
    old_cpu = {"sse4_2", "avx"}
    assert "AVX2" in quantize.int8_unavailable("val", [mx.cpu()], "NCHW", 1, flags=old_cpu)
    assert quantize.int8_unavailable("val", [mx.cpu()], "NCHW", 1, flags=old_cpu | {"avx512_vnni"}) is None
    assert "NCHW" in quantize.int8_unavailable("val", [mx.cpu()], "NHWC", 1, flags={"avx2"})


def test_runner_refuses_int8_training_and_forwards_int8_scoring(digits_data):
    runner = [sys.executable, os.path.join(ROOT, "runner"), "-n", "1", "--data-backend", "synthetic", "--dry-run"]
    refused = subprocess.run(runner + ["--dtype", "int8"], env=venv_env(), capture_output=True, text=True,
                             timeout=HANG_S)
    assert refused.returncode == 2 and "--dtype int8 scores and predicts only" in refused.stderr, refused.stderr
    scoring = subprocess.run(runner + ["--dtype", "int8", "--mode", "val", "--calib-batches", "3"], env=venv_env(),
                             capture_output=True, text=True, timeout=HANG_S)
    assert scoring.returncode == 0, scoring.stderr
    assert "--dtype int8" in scoring.stdout and "--calib-batches 3" in scoring.stdout
    calibrated = subprocess.run(runner[:4] + ["--data-root", str(digits_data), "--dtype", "int8", "--mode", "val",
                                              "--dry-run"], env=venv_env(), capture_output=True, text=True,
                                timeout=HANG_S)
    assert calibrated.returncode == 0, calibrated.stderr
    assert f"--data-train {digits_data}/train.rec" in calibrated.stdout  # the calibration records


ENTROPY_CALIBRATION = """
import sys
import train  # loads MXNet as runner's check and every worker do: without scikit-learn and SciPy
import mxnet as mx
from mxnet.contrib import quantization
import models
from rn50kit.scoring import quantize
assert "scipy" not in sys.modules and quantization.stats is None, "MXNet loaded SciPy"
net = models.get_model("resnet18_v1.5", num_classes=10)
net.initialize(mx.init.Xavier())
net.hybridize()
batches = [mx.io.DataBatch([mx.nd.random.uniform(shape=(4, 3, 32, 32))], pad=0) for _ in range(2)]
calibration = {"mode": "entropy", "batches": 2}
qnet = quantize.quantize(net, (1, 3, 32, 32), calibration, lambda: batches)
print(qnet(mx.nd.zeros((2, 3, 32, 32))).shape, calibration["records"], quantization.stats is not None)
"""


def test_entropy_calibration_works_where_mxnet_was_loaded_without_scipy():
    """train.py hides SciPy while MXNet loads (a second of every start), so MXNet's entropy calibration finds no
    scipy.stats; quantize.quantize gives it one when --calib-mode entropy asks."""
    result = subprocess.run([sys.executable, "-c", ENTROPY_CALIBRATION], cwd=ROOT, env=venv_env(),
                            capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-3:] == ["10)", "8", "True"], result.stdout
