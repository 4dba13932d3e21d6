"""CutMix against the pasted area, BCE and LAMB against numpy references, stochastic depth's training and inference
behaviour: the pieces the RSB-style recipes add (fast, no data files)."""
import json
import math

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from rn50kit.training import fit_flags, optimizers, targets
import models


def constant_batch(n, layout, size=(16, 20)):
    """Image i is filled with the value i + 1, so every pixel tells which image it came from."""
    h, w = size
    values = np.arange(1, n + 1, dtype="float32")
    shape = (n, 3, h, w) if layout == "NCHW" else (n, h, w, 3)
    return mx.nd.array(np.broadcast_to(values.reshape(-1, 1, 1, 1), shape))


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_cutmix_targets_sum_to_one_and_match_the_pasted_area(layout):
    n, classes = 6, 10
    label = mx.nd.array([0, 1, 2, 3, 4, 5])
    rng = np.random.RandomState(0)
    seen_partial = 0
    for _ in range(20):
        data, target = targets.make_targets(label, classes, 0.0, 0.0, rng, constant_batch(n, layout), cutmix=1.0)
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


def test_mixup_and_cutmix_switch_as_asked():
    label = mx.nd.array([0, 1, 2, 3])
    data = constant_batch(4, "NCHW")
    rng = np.random.RandomState(1)
    for _ in range(5):  # switch probability 1: always CutMix (pixels are one image's or the other's)
        mixed, _ = targets.make_targets(label, 4, 0.0, 0.2, rng, data, cutmix=1.0, switch_prob=1.0)
        assert set(np.unique(mixed.asnumpy()[0])) <= {1.0, 4.0}
    mixed, target = targets.make_targets(label, 4, 0.0, 0.2, rng, data, cutmix=1.0, switch_prob=0.0)  # always mixup
    first = mixed.asnumpy()[0]
    assert np.ptp(first) < 1e-6  # a blend: one value over the whole image
    np.testing.assert_allclose(first.flat[0], target.asnumpy()[0, 0] * 1 + target.asnumpy()[0, 3] * 4, rtol=1e-5)


def numpy_bce(logits, target):
    return np.mean(np.maximum(logits, 0) - logits * target + np.log1p(np.exp(-np.abs(logits))), axis=1)


@pytest.mark.parametrize("thresh", [0.0, 0.2])
def test_bce_loss_and_gradient_equal_numpy(thresh):
    rng = np.random.RandomState(2)
    logits = (rng.randn(5, 7) * 4).astype("float32")
    target = rng.dirichlet(np.ones(7) * 0.3, size=5).astype("float32")
    x = mx.nd.array(logits)
    x.attach_grad()
    loss_fn = targets.make_loss(fit_flags.FitConfig(loss="bce", bce_target_thresh=thresh))
    with autograd.record():
        loss = loss_fn(x, mx.nd.array(target))
    loss.backward()
    used = (target > thresh).astype("float32") if thresh else target
    np.testing.assert_allclose(loss.asnumpy(), numpy_bce(logits, used), rtol=1e-5, atol=1e-6)
    sigmoid = 1 / (1 + np.exp(-logits))
    np.testing.assert_allclose(x.grad.asnumpy(), (sigmoid - used) / 7, rtol=1e-4, atol=1e-6)
    assert isinstance(targets.make_loss(fit_flags.FitConfig()), gluon.loss.SoftmaxCrossEntropyLoss)


def numpy_lamb(w, grads, lr, wd, beta1=0.9, beta2=0.999, eps=1e-6):
    """LAMB (You et al. 2020) with bias correction, as MXNet documents it: Adam's direction plus weight decay,
    scaled by the trust ratio ||w|| / ||direction||."""
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        direction = (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps) + wd * w
        r1, r2 = np.linalg.norm(w), np.linalg.norm(direction)
        w = w - lr * (r1 / r2 if r1 > 0 and r2 > 0 else 1.0) * direction
    return w


def test_lamb_steps_equal_numpy():
    rng = np.random.RandomState(3)
    net = gluon.nn.Dense(3, in_units=4, use_bias=False)
    net.initialize(mx.init.Normal(0.5))
    w0 = net.weight.data().asnumpy().astype("float64")
    trainer = optimizers.make_trainer(net, None, "local", "lamb", wd=0.02, momentum=0.9)
    assert type(trainer._optimizer).__name__ == "LAMB"
    grads = []
    for step in range(3):
        x = rng.randn(8, 4).astype("float32")
        trainer.set_learning_rate(0.01 * (step + 1))
        with autograd.record():
            loss = (net(mx.nd.array(x)) ** 2).sum()
        loss.backward()
        grads.append(net.weight.grad().asnumpy().astype("float64") / 8)  # update(8) rescales by 1/8
        trainer.update(8)
    # The LR changes every step: replay the three steps in numpy
    m, v, w = np.zeros_like(w0), np.zeros_like(w0), w0
    for t, g in enumerate(grads, start=1):
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        direction = (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-6) + 0.02 * w
        w = w - 0.01 * t * np.linalg.norm(w) / np.linalg.norm(direction) * direction
    np.testing.assert_allclose(net.weight.data().asnumpy(), w, rtol=1e-4, atol=1e-6)
    assert not np.allclose(w, w0)


def test_lamb_one_step_equals_the_reference_function():
    net = gluon.nn.Dense(2, in_units=3, use_bias=False)
    net.initialize(mx.init.Normal(1.0))
    w0 = net.weight.data().asnumpy().astype("float64")
    trainer = optimizers.make_trainer(net, None, "local", "lamb", wd=0.0, momentum=0.0)
    trainer.set_learning_rate(0.1)
    x = np.array([[1.0, -2.0, 0.5], [0.3, 0.1, -1.0]], dtype="float32")
    with autograd.record():
        loss = net(mx.nd.array(x)).sum()
    loss.backward()
    g = net.weight.grad().asnumpy().astype("float64") / 2
    trainer.update(2)
    np.testing.assert_allclose(net.weight.data().asnumpy(), numpy_lamb(w0, [g], lr=0.1, wd=0.0), rtol=1e-4)


def test_drop_path_keeps_the_expected_value_in_training_and_is_identity_at_inference():
    p, n = 0.5, 4000
    block = models.BatchNormAddReLU(drop_path=p, in_channels=2, gamma_initializer="zeros", beta_initializer="ones")
    block.initialize()
    block.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.random.normal(shape=(n, 2, 3, 3))
    addend = mx.nd.zeros((n, 2, 3, 3))
    with autograd.record(train_mode=True):  # bn(x) = beta = 1 everywhere: the branch is 1 or dropped
        out = block(x, addend).asnumpy()
    per_sample = out.reshape(n, -1)
    assert set(np.unique(per_sample)) <= {0.0, 1 / (1 - p)}
    assert (per_sample.min(axis=1) == per_sample.max(axis=1)).all()  # the whole branch of a sample, or none
    kept = (per_sample[:, 0] > 0).mean()
    assert abs(kept - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    assert abs(per_sample.mean() - 1) < 5 * math.sqrt(p / (1 - p) / n)
    np.testing.assert_array_equal(block(x, addend).asnumpy(), np.ones((n, 2, 3, 3)))  # inference: identity


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_drop_path_is_absent_from_the_scoring_graph_and_changes_no_prediction():
    kwargs = dict(num_classes=5)
    plain = models.get_model("resnet18_v1.5", **kwargs)
    dropped = models.get_model("resnet18_v1.5", drop_path=0.2, **kwargs)
    rates = [block.bn_add_relu.drop_path for block in dropped.features if hasattr(block, "bn_add_relu")]
    np.testing.assert_allclose(rates, np.linspace(0, 0.2, 8))  # rising linearly, 0 at the first block
    ops = lambda net: {node["op"] for node in json.loads(net(mx.sym.var("data")).tojson())["nodes"]}
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
