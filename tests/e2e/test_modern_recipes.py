"""The named recipes from published procedures (rsb-a3, ffcv-24) start, train a few steps and resume on the demo
data; CutMix's targets and stochastic depth's scoring graph."""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

import fit
import models
from support.loop import constant_batch
from support.processes import HANG_S, ROOT, venv_env
from support.runs import digits_run


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_cutmix_targets_sum_to_one_and_match_the_pasted_area(layout):
    """Added with the RSB-style recipes' pieces (CutMix, BCE, LAMB, stochastic depth)."""
    n, classes = 6, 10
    label = mx.nd.array([0, 1, 2, 3, 4, 5])
    rng = np.random.RandomState(0)
    seen_partial = 0
    for _ in range(20):
        data, target = fit.make_targets(label, classes, 0.0, 0.0, rng, constant_batch(n, layout), cutmix=1.0)
        data, target = data.asnumpy(), target.asnumpy()
        np.testing.assert_allclose(target.sum(axis=1), 1, rtol=1e-6)
        for i in range(n):
            own, other = i + 1, n - i  # the reversed batch's image is n - 1 - i, filled with n - i
            pixels = data[i] if layout == "NCHW" else data[i].transpose(2, 0, 1)
            assert set(np.unique(pixels)) <= {own, other}
            pasted = float((pixels == other).mean())
            expected = np.zeros(classes)
            expected[i] += 1 - pasted
            expected[n - 1 - i] += pasted
            np.testing.assert_allclose(target[i], expected, atol=1e-6)
            seen_partial += 0 < pasted < 1
    assert seen_partial > 0  # boxes were really pasted


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_drop_path_is_absent_from_the_scoring_graph_and_changes_no_prediction():
    """Added with the RSB-style recipes' pieces (CutMix, BCE, LAMB, stochastic depth)."""
    kwargs = dict(num_classes=5)
    plain = models.get_model("resnet18_v1.5", **kwargs)
    dropped = models.get_model("resnet18_v1.5", drop_path=0.2, **kwargs)
    rates = [block.bn_add_relu.drop_path for block in dropped.features if hasattr(block, "bn_add_relu")]
    np.testing.assert_allclose(rates, np.linspace(0, 0.2, 8))  # rising linearly, 0 at the first block

    def ops(net):
        return {node["op"] for node in json.loads(net(mx.sym.var("data")).tojson())["nodes"]}

    assert "Dropout" not in ops(plain) and "Dropout" in ops(dropped)
    plain.initialize(mx.init.Xavier())
    dropped.initialize(mx.init.Xavier())
    x = mx.nd.random.uniform(shape=(2, 3, 32, 32))
    plain(x)
    dropped(x)
    for (_, a), (_, b) in zip(sorted(plain.collect_params().items()), sorted(dropped.collect_params().items())):
        b.set_data(a.data())
    for net in (plain, dropped):
        net.hybridize()
    np.testing.assert_allclose(dropped(x).asnumpy(), plain(x).asnumpy(), rtol=1e-5, atol=1e-6)


pytestmark = pytest.mark.slow


# Each recipe's own values, except the resolutions: the digits are 32 px (A3 trains at 160/224 of the test size,
# FFCV ramps 160 -> 192 with a 256 test size: here 24 px, and 24 -> 32 px between epochs 0 and 1).
SIZES = {"rsb-a3": ["--train-size", "24"],
         "ffcv-24": ["--train-size", "24,32", "--train-size-epochs", "0,1", "--train-size-step", "8"]}


@pytest.mark.parametrize("recipe", sorted(SIZES))
def test_recipe_starts_trains_and_resumes(digits_data, tmp_path, recipe):
    command = [sys.executable, os.path.join(ROOT, "train.py"), *digits_run(digits_data), "--recipe", recipe,
               *SIZES[recipe], "--batch-size", "16", "--num-epochs", "2", "--benchmark-iters", "3", "--seed", "1",
               "--workspace", str(tmp_path), "--disp-batches", "0"]
    first = subprocess.run(command + ["--run-epochs", "1"], env=venv_env(), capture_output=True, text=True,
                           timeout=HANG_S)
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"recipe {recipe}" in first.stderr
    with open(tmp_path / "model-0001.state.json") as f:
        args = json.load(f)["args"]
    assert args["recipe"] == recipe
    if recipe == "rsb-a3":
        assert (args["optimizer"], args["loss"], args["auto_augment"], args["cutmix"]) == \
            ("lamb", "bce", "randaugment", 1.0)
    second = subprocess.run(command, env=venv_env(), capture_output=True, text=True, timeout=HANG_S)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Resuming from" in second.stderr and "after epoch 1" in second.stderr
    with open(tmp_path / "report.json") as f:
        metrics = json.load(f)["metrics"]
    assert len(metrics["val.top1"]) == 2 and len(metrics["train.loss"]) == 2
    assert all(loss == loss and loss < 50 for loss in metrics["train.loss"])  # finite
