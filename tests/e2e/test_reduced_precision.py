"""The overflow check of float16 training on the real parameter structure of every architecture.

MXNet's CPU build cannot run a float16 network ("FP16 gemm on cpu not implemented"), but it builds one: the cast
network has float16 convolution/FC parameters and float32 BatchNorm parameters, with gradients attached, on as
many contexts as asked. The kit's own check (precision.grads_finite, precision.StatsGuard) and loss-scaling update run on
those arrays here, against numpy's verdict on the same values.
"""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

import models
from conftest import HANG_S, ROOT, venv_env
from rn50kit.training import precision

TWO_DEVICES = [mx.cpu(0), mx.cpu(1)]


def float16_network(name, ctxs):
    net = models.get_model(name, num_classes=10, dtype="float16")
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    net.infer_shape(mx.nd.zeros((1, 3, 32, 32), dtype="float16"))
    for param in net.collect_params().values():
        param._finish_deferred_init()
    return net


def trainable(net):
    return [p for p in net.collect_params().values() if p.grad_req != "null"]


def numpy_all_finite(arrays):
    return all(np.isfinite(a.asnumpy()).all() for a in arrays)


def test_one_multi_all_finite_call_refuses_mixed_dtypes():
    """The library fact the grouping is for (MXNet takes the element type from the first input)."""
    with pytest.raises(mx.base.MXNetError, match="data type do not match"):
        mx.nd.multi_all_finite(mx.nd.ones(3, dtype="float16"), mx.nd.ones(3), num_arrays=2).asscalar()


@pytest.mark.slow
@pytest.mark.parametrize("name", models.list_models())
def test_overflow_caught_in_every_gradient_group_of_every_architecture(name):
    ctxs = TWO_DEVICES if name == "resnet152_v1.5" else [mx.cpu()]  # the deepest: 2 x 467 gradient arrays
    net = float16_network(name, ctxs)
    params = trainable(net)
    grads = [g for p in params for g in p.list_grad()]
    assert {np.dtype(g.dtype).name for g in grads} == {"float16", "float32"}  # BatchNorm's stay float32
    groups = precision.finite_check_groups(grads)
    assert sorted(id(a) for group in groups for a in group) == sorted(id(g) for g in grads)  # each array once
    for group in groups:
        assert len(group) <= 200
        assert len({(a.context, np.dtype(a.dtype)) for a in group}) == 1
    scaler = precision.make_loss_scaler(None, "float16")
    assert numpy_all_finite(grads) and precision.grads_finite(params)  # gradients start as zeros
    scaler.update(precision.grads_finite(params))
    assert scaler.scale == 2.0 ** 16 and scaler.clean_steps == 1
    # The last array of every group (device, dtype, chunk of 200): an overflow anywhere is caught.
    for group in groups:
        victim = group[-1]
        victim[:] = np.inf if np.dtype(victim.dtype) == np.float16 else np.nan
        assert not numpy_all_finite([victim])
        finite = precision.grads_finite(params)
        assert not finite, (victim.context, victim.dtype, victim.shape)
        scale = scaler.scale
        scaler.update(finite)
        assert scaler.scale == scale / 2 and scaler.clean_steps == 0
        victim[:] = 0
    assert precision.grads_finite(params)


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_float16_overflow_of_a_large_value_is_caught():
    """A gradient that overflows float16's range (65504) is inf in float16, and the check sees it."""
    net = float16_network("resnet50_v1.5", [mx.cpu()])
    conv = [p for p in trainable(net) if np.dtype(p.dtype) == np.float16][-1]
    conv.grad()[:] = mx.nd.array([70000.0]).astype("float16").broadcast_to(conv.grad().shape)
    assert not precision.grads_finite(trainable(net))


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_batchnorm_statistics_guard_on_two_devices():
    """StatsGuard of ResNet-152 (310 float32 statistics per device) restores a poisoned one on the 2nd device."""
    net = float16_network("resnet152_v1.5", TWO_DEVICES)
    guard = precision.StatsGuard(net)
    assert len(guard.stats) == 2 * 310
    guard.keep()
    stats = models.running_stats(net)
    kept = stats[-1].data(mx.cpu(1)).asnumpy().copy()
    stats[-1].data(mx.cpu(1))[:] = np.inf
    guard.restore_if_bad()
    np.testing.assert_array_equal(stats[-1].data(mx.cpu(1)).asnumpy(), kept)


@pytest.mark.slow
def test_resnet101_with_dynamic_loss_scaling_trains_through_runner(tmp_path):
    """The issue's reproducer: over 300 gradient arrays, dynamic loss scaling, one worker."""
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "runner"), "-n", "1", "-b", "2", "--dtype", "float32",
         "--data-backend", "synthetic", "--num-layers", "101", "--loss-scale", "dynamic", "--benchmark-iters", "2",
         "-e", "1", "--image-shape", "3,32,32", "--num-classes", "10", "--mode", "train",
         "--workspace", str(tmp_path)], env=venv_env(), capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "report.json") as f:
        losses = json.load(f)["metrics"]["train.loss"]
    assert len(losses) == 1 and np.isfinite(losses[0])
    with open(tmp_path / "log.jsonl") as f:
        steps = [entry for entry in map(json.loads, f) if entry["type"] == "iter"]
    assert len(steps) == 2 and all(step["loss_scale"] == 2.0 ** 16 for step in steps)  # scaled, no overflow
