"""Loss scaling, weight-decay groups, LR schedules and recipes, on real MXNet (in process, CPU)."""
import math

import mxnet as mx
from mxnet import gluon
import numpy as np
import pytest

import fit
from rn50kit.training import optimizers, targets
from rn50kit.training.ema import EMA
import models
from rn50kit.training import precision
from rn50kit.common import schedules


def small_net():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, in_units=4), gluon.nn.BatchNorm(in_channels=8), gluon.nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier())
    return net


def snapshot(net):
    return {k: p.data().asnumpy().copy() for k, p in net.collect_params().items()}


def test_overflow_step_is_skipped_and_scale_lowered_then_training_continues():
    net = small_net()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9,
                                                           "multi_precision": True}, kvstore=None)
    scaler = precision.LossScaler(2.0 ** 16, dynamic=True)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)
    target = mx.nd.one_hot(mx.nd.array([0, 1, 2, 1]), 3)
    good = mx.nd.random.uniform(shape=(4, 4))
    bad = good.copy()
    bad[1, 2] = np.inf  # injected overflow
    guard = precision.StatsGuard(net)
    _, _, applied = fit.train_step(net, trainer, scaler, loss_fn, [good], [target], 4, guard)
    assert applied
    before = snapshot(net)
    _, _, applied = fit.train_step(net, trainer, scaler, loss_fn, [bad], [target], 4, guard)
    assert not applied
    assert scaler.scale == 2.0 ** 15 and scaler.bad_steps == 1
    after = snapshot(net)
    for name in before:  # BN statistics included: the guard undid the bad forward pass
        np.testing.assert_array_equal(before[name], after[name], err_msg=name)
    _, _, applied = fit.train_step(net, trainer, scaler, loss_fn, [good], [target], 4, guard)
    assert applied and scaler.bad_steps == 0
    moved = snapshot(net)
    assert any(not np.array_equal(moved[n], after[n]) for n in moved if n.endswith("weight"))
    assert all(np.isfinite(v).all() for v in moved.values())


def test_nonfinite_loss_skips_the_update_without_a_gradient_scan():
    """float32 path: no loss scaling, no gradient scan; the NaN/inf loss alone stops the update."""
    net = small_net()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9}, kvstore=None)
    scaler = precision.LossScaler(1.0)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)
    target = mx.nd.one_hot(mx.nd.array([0, 1, 2, 1]), 3)
    bad = mx.nd.random.uniform(shape=(4, 4))
    bad[0, 0] = np.nan
    votes = []
    before = snapshot(net)
    _, _, applied = fit.train_step(net, trainer, scaler, loss_fn, [bad], [target], 4, precision.StatsGuard(net),
                                   vote=lambda ok: votes.append(ok) or ok, scan_grads=False)
    assert not applied and votes == [False] and scaler.bad_steps == 1
    after = snapshot(net)
    for name in before:
        np.testing.assert_array_equal(before[name], after[name], err_msg=name)


def test_dynamic_scale_grows_after_clean_steps():
    scaler = precision.LossScaler(8.0, dynamic=True, growth_interval=3)
    for _ in range(3):
        scaler.update(True)
    assert scaler.scale == 16.0
    static = precision.LossScaler(1.0)
    static.update(False)
    assert static.scale == 1.0 and static.bad_steps == 1


def test_batchnorm_and_bias_get_no_weight_decay_conv_weights_do():
    net = models.get_model("resnet18_v1.5", num_classes=5)
    net.initialize(mx.init.Xavier())
    x = mx.nd.random.uniform(shape=(2, 3, 32, 32))
    optimizers.set_wd_groups(net)
    lr, wd = 0.5, 0.1
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": lr, "wd": wd, "momentum": 0.0},
                            kvstore=None)
    with mx.autograd.record():
        loss = net(x).sum() * 0  # zero gradients: any change comes from weight decay alone
    loss.backward()
    before = snapshot(net)
    trainer.step(1)
    after = snapshot(net)
    kinds = {"conv": 0, "bn": 0, "bias": 0}
    for name, value in before.items():
        if "running" in name:
            continue
        if name.endswith(("gamma", "beta", "bias")):
            np.testing.assert_array_equal(after[name], value, err_msg=name)
            kinds["bias" if name.endswith("bias") else "bn"] += 1
        else:
            np.testing.assert_allclose(after[name], value * (1 - lr * wd), rtol=1e-5, atol=1e-7, err_msg=name)
            kinds["conv"] += "conv" in name
    assert kinds["conv"] > 10 and kinds["bn"] > 10 and kinds["bias"] == 1
    optimizers.set_wd_groups(net, decay_all=True)
    assert all(p.wd_mult == 1.0 for p in net.collect_params().values())


def test_schedules_match_their_formulas():
    cos = schedules.get_schedule("cosine", 1.0, 10, warmup_epochs=2)
    assert cos(1.0) == pytest.approx(0.5) and cos(2.0) == pytest.approx(1.0)
    assert cos(6.0) == pytest.approx(0.5) and cos(10.0) == pytest.approx(0.0, abs=1e-12)
    step = schedules.get_schedule("step", 1.0, 90, warmup_epochs=0, steps=[30, 60, 80], factor=0.1)
    assert [step(e) for e in (0, 29.9, 30, 65, 85)] == pytest.approx([1, 1, 0.1, 0.01, 0.001])
    poly = schedules.get_schedule("poly", 1.0, 10, power=2)
    assert poly(5) == pytest.approx(0.25)
    linear = schedules.get_schedule("linear", 1.0, 10, warmup_epochs=0)
    assert linear(2.5) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="unknown LR schedule"):
        schedules.get_schedule("exp", 1.0, 10)


def test_recipe_gives_the_defaults_and_the_command_line_wins():
    import train
    args = train.parse_args(["--recipe", "he", "--batch-size", "512", "--mom", "0.8"])
    train.fill_hyper_parameters(args)
    assert args.optimizer == "nag" and args.mom == 0.8 and args.lr == pytest.approx(0.2)
    assert args.lr_steps == [30, 60, 80] and args.wd == 1e-4 and args.num_epochs == 90
    args = train.parse_args(["--recipe", "nvidia-2019", "--lr", "0.3"])
    train.fill_hyper_parameters(args)
    assert args.lr == 0.3 and args.min_random_area == 0.05 and args.lr_schedule == "step"
    # A flag typed with the value the parser would default to still wins over the recipe (apply_recipe, before,
    # took a value equal to the parser default for unset: this trained with 0.05).
    args = train.parse_args(["--recipe", "nvidia-2019", "--min-random-area", "0.08", "--mom", "0.875"])
    assert args.min_random_area == 0.08 and args.mom == 0.875 and args.wd == 1e-4
    args = train.parse_args(["--rec", "he"])  # an abbreviation, as argparse accepts for every flag
    assert args.recipe == "he" and args.optimizer == "nag"
    args = train.parse_args([])
    train.fill_hyper_parameters(args)
    assert args.lr == pytest.approx(0.256 * 192 / 256) and args.mom == 0.875 and args.wd == 1 / 32768
    assert args.label_smoothing == 0.1 and args.lr_schedule == "cosine" and math.isclose(args.warmup_epochs, 5)


def test_ema_follows_the_exponential_average_of_the_weights():
    net = small_net()
    decay = 0.9
    ema = EMA(net, decay)
    history = [snapshot(net)]
    for _ in range(2):  # move the weights, then fold them into the average
        for p in net.collect_params().values():
            p.set_data(p.data() + mx.nd.random.uniform(shape=p.shape))
        history.append(snapshot(net))
        ema.update()
    expected = {}
    for name in history[0]:
        expected[name] = history[0][name]
        for weights in history[1:]:
            expected[name] = decay * expected[name] + (1 - decay) * weights[name]
        np.testing.assert_allclose(ema.shadow[name].asnumpy(), expected[name], rtol=1e-5, err_msg=name)
    live = snapshot(net)
    ema.swap()  # validation runs on the averages, then the live weights come back
    swapped = snapshot(net)
    ema.swap()
    restored = snapshot(net)
    for name in live:
        np.testing.assert_allclose(swapped[name], expected[name], rtol=1e-5, err_msg=name)
        np.testing.assert_array_equal(restored[name], live[name], err_msg=name)


def test_mixup_mixes_each_sample_with_the_reversed_batch():
    data = mx.nd.random.uniform(shape=(4, 3, 2, 2))
    label = mx.nd.array([0, 1, 2, 1])
    rng = np.random.RandomState(5)
    mixed, target = targets.make_targets(label, 3, 0.0, 0.2, rng, data)
    coeffs = np.random.RandomState(5).beta(0.2, 0.2, size=4).astype("float32")
    x, onehot = data.asnumpy(), np.eye(3, dtype="float32")[[0, 1, 2, 1]]
    c = coeffs.reshape(-1, 1, 1, 1)
    np.testing.assert_allclose(mixed.asnumpy(), c * x + (1 - c) * x[::-1], rtol=1e-5)
    np.testing.assert_allclose(target.asnumpy(), coeffs[:, None] * onehot + (1 - coeffs[:, None]) * onehot[::-1],
                               rtol=1e-5)
    np.testing.assert_allclose(target.asnumpy().sum(axis=1), 1.0, rtol=1e-5)
