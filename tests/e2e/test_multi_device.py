"""One process, two CPU contexts standing for two GPUs (--kv-store device/local): train, resume and score through
train.py's real code."""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from support.processes import HANG_S, ROOT, venv_env

pytestmark = pytest.mark.slow  # launches processes, trains end to end or builds heavy data


def run_train(*args):
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--kv-store", "device", "--cpu-contexts", "2", *args]
    result = subprocess.run(command, env=venv_env(), capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_train_resume_and_score_on_two_contexts(digits_data, tmp_path):
    common = ["--data-backend", "dali-cpu", "--dali-threads", "1", "--dali-validation-threads", "1",
              "--data-val", str(digits_data / "val.rec"), "--data-val-idx", str(digits_data / "val.idx"),
              "--num-layers", "18", "--num-classes", "10", "--image-shape", "3,32,32", "--data-val-resize", "32",
              "--batch-size", "32", "--workspace", str(tmp_path)]
    training = ["--data-train", str(digits_data / "train.rec"), "--data-train-idx", str(digits_data / "train.idx"),
                "--num-epochs", "2", "--num-examples", "384", "--lr", "0.1", "--warmup-epochs", "0",
                "--random-mirror", "0", "--min-random-area", "0.5", "--seed", "2"]
    first = run_train(*common, *training, "--run-epochs", "1")
    assert "Saved checkpoint" in first.stderr
    resumed = run_train(*common, *training)  # loads the parameters on both contexts
    assert "Resuming from" in resumed.stderr and "epoch 1" in resumed.stderr
    with open(tmp_path / "report.json") as f:
        metrics = json.load(f)["metrics"]
    assert len(metrics["train.loss"]) == 2 and len(metrics["val.top1"]) == 2
    assert all(np.isfinite(metrics["train.loss"]))
    # Scoring the last checkpoint on two contexts, and on one, gives the last validation of the training run:
    # the same weights and samples, each counted once, whatever the split over devices.
    run_train(*common, "--mode", "val", "--num-epochs", "1", "--report", "score2.json")
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--kv-store", "local", *common, "--mode", "val",
               "--num-epochs", "1", "--report", "score1.json"]
    result = subprocess.run(command, env=venv_env(), capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("score2.json", "score1.json"):
        with open(tmp_path / name) as f:
            scored = json.load(f)["metrics"]
        assert abs(scored["val.top1"][0] - metrics["val.top1"][-1]) < 1e-9, (name, scored, metrics["val.top1"])
        assert abs(scored["val.loss"][0] - metrics["val.loss"][-1]) < 1e-4 * abs(metrics["val.loss"][-1])


# train.py with its CPU contexts moved up by one ([cpu(1), cpu(2)]): no cpu(0), as on GPUs, where
# Parameter.data() without a context (which asks for cpu(0)) fails.
WITHOUT_CPU0 = """import sys, mxnet as mx, train
from rn50kit.training import worker
chosen = worker.contexts
worker.contexts = lambda *args, **kwargs: [mx.cpu(c.device_id + 1) for c in chosen(*args, **kwargs)]
train.run(sys.argv[1:])
"""


@pytest.mark.slow
def test_training_with_ema_on_contexts_without_cpu0_matches_cpu0_and_cpu1(tmp_path):
    """The memory check, EMA's update, swap (validation) and save, and a resume, on [cpu(1), cpu(2)]: the same
    losses and EMA weights as on [cpu(0), cpu(1)]."""
    common = ["--data-backend", "synthetic", "--dtype", "float32", "--num-layers", "18", "--image-shape", "3,32,32",
              "--num-classes", "10", "--batch-size", "8", "--num-epochs", "2", "--num-examples", "32", "--seed", "2",
              "--ema-decay", "0.9", "--memory-check", "refuse"]
    for name in ("with_cpu0", "without_cpu0"):
        for extra in (["--run-epochs", "1"], []):  # stopped after an epoch, then resumed
            workspace = ["--workspace", str(tmp_path / name)]
            if name == "with_cpu0":
                run_train(*common, *extra, *workspace)
                continue
            command = [sys.executable, "-c", WITHOUT_CPU0, "--kv-store", "device", "--cpu-contexts", "2", *common,
                       *extra, *workspace]
            result = subprocess.run(command, env=venv_env(), capture_output=True, text=True, timeout=HANG_S)
            assert result.returncode == 0, result.stderr[-3000:]
    reports = {}
    for name in ("with_cpu0", "without_cpu0"):
        with open(tmp_path / name / "report.json") as f:
            reports[name] = json.load(f)["metrics"]
    assert len(reports["without_cpu0"]["train.loss"]) == 2
    np.testing.assert_allclose(reports["without_cpu0"]["train.loss"], reports["with_cpu0"]["train.loss"], rtol=1e-5)
    averages = [mx.nd.load(str(tmp_path / name / "model-0002-ema.params")) for name in ("with_cpu0", "without_cpu0")]
    for key, value in averages[0].items():
        np.testing.assert_allclose(averages[1][key].asnumpy(), value.asnumpy(), rtol=1e-5, atol=1e-6, err_msg=key)
