"""fit's training loop in process on tiny networks: phases stopped, saved and resumed, EMA, loss scaling steps,
weight-decay groups, gradient accumulation, mixup and CutMix, BCE, model_best."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import fit
import models
import train
from rn50kit.config import fit_flags, train_config
from rn50kit.scoring import scoring
from rn50kit.training import optimizers, precision
from rn50kit.weights import checkpoint
from support import loop as loop_harness
from support.loop import (
    ACCUM,
    CPU,
    MICRO,
    RUN,
    TINY_CLASSES,
    AccumBatches,
    ListedBatches,
    constant_batch,
    fit_config,
    learned_accum,
    tiny_accum_net,
)

CLASSES, BATCH, STEPS, STOP_AFTER = 4, 8, 6, 3


class Batches(ListedBatches):
    """The same STEPS batches every epoch; ``on_draw(i)`` is called as batch i is drawn."""

    def __init__(self, on_draw=None, steps=STEPS):
        rng = np.random.RandomState(0)
        super().__init__([(rng.uniform(-1, 1, (BATCH, 3, 8, 8)).astype("float32"),
                           rng.randint(0, CLASSES, BATCH).astype("float32")) for _ in range(steps)], on_draw)


def tiny_net(init_file):
    return tiny_accum_net(init_file, batchnorm="live")


@pytest.fixture()
def args(tmp_path):
    parsed = train.parse_args(["--kv-store", "local", "--dtype", "float32", "--batch-size", str(BATCH),
                               "--num-epochs", "2", "--lr", "0.2", "--warmup-epochs", "0.5", "--mixup", "0.2",
                               "--num-classes", str(CLASSES), "--seed", "3", "--ema-decay", "0.9",
                               "--workspace", str(tmp_path), "--disp-batches", "0", "--keep-last", "0"])
    train.fill_hyper_parameters(parsed)
    return train_config.from_args(parsed).fit


def start(args, net):
    return loop_harness.start(args, net, CLASSES)


# BatchNorm's running statistics are not reproducible on MXNet 1.9.1's CPU build: of two identical runs in one
# process one can end a few steps with a running variance 8 % off the other's (as if one update were missing),
# while every weight and gradient agrees exactly. They do not feed back into training (which normalises with
# the batch's statistics), so the resumed epoch is compared on the trained weights, exactly, and on the running
# statistics only for being finite.


def learned(name):
    return not name.endswith(("running_mean", "running_var"))


def weights(net):
    return {name: p.data().asnumpy() for name, p in net.collect_params().items()}


def test_an_epoch_stopped_saved_and_resumed_ends_as_the_uninterrupted_one(args, tmp_path, keep_signal_handlers):
    init = tmp_path / "init.params"
    net = tiny_net(init)
    state, loop = start(args, net)
    whole, steps, stopped_at = fit.train_one_epoch(args, loop, state, Batches(), epoch=1)
    assert (steps, stopped_at, whole.steps, whole.samples) == (STEPS, None, STEPS, STEPS * BATCH)

    # The same epoch, asked to stop as its third batch is drawn: it ends after that step and is saved.
    net_b = tiny_net(init)
    state_b, loop_b = start(args, net_b)
    first, _, stopped_at = fit.train_one_epoch(args, loop_b, state_b, Batches(
        on_draw=lambda i: setattr(loop_b.stop, "requested", i >= STOP_AFTER - 1)), epoch=1)
    assert stopped_at == STOP_AFTER and first.steps == STOP_AFTER
    prefix = str(tmp_path / "model")
    fit.save_checkpoint(prefix, net_b, state_b, RUN, epoch=1, step=stopped_at, keep_last=0, seed=args.seed,
                        partials=fit.gather_partial(first, loop_b.dist, "partial"))

    # A fresh process's view: new network and state, restored from the files, the epoch finished from there.
    net_c = tiny_net(init)
    state_c, loop_c = start(args, net_c)
    saved = checkpoint.find_latest(prefix)
    assert (saved["epoch"], saved["step"]) == (1, STOP_AFTER)
    fit.resume(state_c, saved, RUN, net_c, CPU, loop_c.dist)
    assert (state_c.epoch, state_c.step) == (1, STOP_AFTER)
    rest, _, stopped_at = fit.train_one_epoch(args, loop_c, state_c, Batches(), epoch=1, skip=state_c.step)
    assert stopped_at is None
    assert rest.sums() == pytest.approx(whole.sums(), rel=1e-6)  # loss, steps and hits of the whole epoch
    resumed = weights(net_c)
    for name, value in weights(net).items():
        if learned(name):
            np.testing.assert_allclose(resumed[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
        else:
            assert np.isfinite(resumed[name]).all()
    for name, value in state.ema.shadow.items():
        if learned(name):
            np.testing.assert_allclose(state_c.ema.shadow[name].asnumpy(), value.asnumpy(), rtol=1e-5, atol=1e-6)


def test_validate_scores_the_ema_weights_and_puts_the_live_ones_back(args, tmp_path, keep_signal_handlers):
    init = tmp_path / "init.params"
    net = tiny_net(init)
    state, loop = start(args, net)
    fit.train_one_epoch(args, loop, state, Batches(), epoch=0)
    live = weights(net)
    val = Batches(steps=2)
    metrics = fit.validate(net, state.ema, val, CPU, loop.dist, "float32", no_metrics=False)
    for name, value in weights(net).items():
        np.testing.assert_array_equal(value, live[name])
    # Reference: a second network holding the averages, scored by evaluate() and by numpy.
    averaged = tiny_net(init)
    for name, param in averaged.collect_params().items():
        param.set_data(state.ema.shadow[name])
    reference = scoring.evaluate(averaged, val, CPU, loop.dist, "float32")
    assert metrics["top1"] == reference["top1"] and metrics["loss"] == pytest.approx(reference["loss"])
    logits = np.concatenate([averaged(b.data[0]).asnumpy() for b in val])
    labels = np.concatenate([b.label[0].asnumpy() for b in val])
    assert metrics["top1"] == pytest.approx(np.mean(logits.argmax(1) == labels))
    assert metrics["top1"] != scoring.evaluate(net, val, CPU, loop.dist, "float32")["top1"] or \
        not np.allclose(logits, np.concatenate([net(b.data[0]).asnumpy() for b in val]))  # EMA is not the live net


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


def test_ema_follows_the_exponential_average_of_the_weights():
    net = small_net()
    decay = 0.9
    ema = fit.EMA(net, decay)
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
    mixed, target = fit.make_targets(label, 3, 0.0, 0.2, rng, data)
    coeffs = np.random.RandomState(5).beta(0.2, 0.2, size=4).astype("float32")
    x, onehot = data.asnumpy(), np.eye(3, dtype="float32")[[0, 1, 2, 1]]
    c = coeffs.reshape(-1, 1, 1, 1)
    np.testing.assert_allclose(mixed.asnumpy(), c * x + (1 - c) * x[::-1], rtol=1e-5)
    np.testing.assert_allclose(target.asnumpy(), coeffs[:, None] * onehot + (1 - coeffs[:, None]) * onehot[::-1],
                               rtol=1e-5)
    np.testing.assert_allclose(target.asnumpy().sum(axis=1), 1.0, rtol=1e-5)


def start_accum(cfg, net):
    return loop_harness.start(cfg, net, TINY_CLASSES)


@pytest.mark.parametrize("optimizer,batchnorm", [("sgd", "none"), ("lars", "none"), ("sgd", "frozen")])
def test_accumulated_micro_batches_equal_one_large_batch(tmp_path, keep_signal_handlers, optimizer, batchnorm):
    """3 micro-batches of 4 accumulated = 1 batch of 12: the same weights, EMA and epoch sums, to float32
    summation order (rtol 1e-5), over 2 optimizer steps. Exact only without live BatchNorm: a live BatchNorm
    normalises each micro-batch with its own statistics, which differ from the large batch's (no claim made)."""
    init = tmp_path / "init.params"
    large_net, micro_net = tiny_accum_net(init, batchnorm), tiny_accum_net(init, batchnorm)
    large_cfg = fit_config(tmp_path, MICRO * ACCUM, 1, "--optimizer", optimizer)
    micro_cfg = fit_config(tmp_path, MICRO, ACCUM, "--optimizer", optimizer)
    large_state, large_loop = start_accum(large_cfg, large_net)
    micro_state, micro_loop = start_accum(micro_cfg, micro_net)
    large, large_steps, _ = fit.train_one_epoch(large_cfg, large_loop, large_state, AccumBatches(MICRO * ACCUM, 2), 0)
    micro, micro_steps, _ = fit.train_one_epoch(micro_cfg, micro_loop, micro_state, AccumBatches(MICRO, 2 * ACCUM), 0)
    assert (large_steps, micro_steps) == (2, 2 * ACCUM)
    assert micro.samples == large.samples == 2 * ACCUM * MICRO
    assert micro.correct1 == large.correct1
    assert micro.loss / micro.steps == pytest.approx(large.loss / large.steps, rel=1e-5)
    expected = learned_accum(large_net)
    moved = False
    for name, value in learned_accum(micro_net).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
        moved |= not np.allclose(value, micro_state.ema.shadow[name].asnumpy())
    for name, value in large_state.ema.shadow.items():
        np.testing.assert_allclose(micro_state.ema.shadow[name].asnumpy(), value.asnumpy(), rtol=1e-5, atol=1e-6)
    assert moved  # trained: the EMA lags the weights


def test_the_lr_changes_once_per_optimizer_step(tmp_path, keep_signal_handlers):
    cfg = fit_config(tmp_path, MICRO, ACCUM)
    state, loop = start_accum(cfg, tiny_accum_net(tmp_path / "init.params"))
    asked = []
    schedule = state.schedule
    state.schedule = lambda epoch: asked.append(epoch) or schedule(epoch)
    fit.train_one_epoch(cfg, loop, state, AccumBatches(MICRO, 4 * ACCUM + 2), epoch=1)  # 2 batches left over
    assert asked == [1.0, 1.25, 1.5, 1.75]
    assert state.trainer.learning_rate == schedule(1.75)


def test_stopped_inside_an_accumulation_and_resumed_ends_as_the_uninterrupted(tmp_path, keep_signal_handlers):
    init = tmp_path / "init.params"
    cfg = fit_config(tmp_path, MICRO, ACCUM)
    net = tiny_accum_net(init, "live")
    state, loop = start_accum(cfg, net)
    whole, _, stopped_at = fit.train_one_epoch(cfg, loop, state, AccumBatches(MICRO, 4 * ACCUM), epoch=1)
    assert stopped_at is None

    # Asked to stop as the 5th batch (the 2nd of the 2nd accumulation) is drawn: the optimizer step ends first.
    net_b = tiny_accum_net(init, "live")
    state_b, loop_b = start_accum(cfg, net_b)
    first, _, stopped_at = fit.train_one_epoch(cfg, loop_b, state_b, AccumBatches(
        MICRO, 4 * ACCUM, on_draw=lambda i: setattr(loop_b.stop, "requested", i >= 4)), epoch=1)
    assert stopped_at == 2 * ACCUM and first.steps == 2 * ACCUM
    prefix = str(tmp_path / "model")
    fit.save_checkpoint(prefix, net_b, state_b, RUN, epoch=1, step=stopped_at, keep_last=0, seed=cfg.seed,
                        partials=fit.gather_partial(first, loop_b.dist, "partial"))

    net_c = tiny_accum_net(init, "live")
    state_c, loop_c = start_accum(cfg, net_c)
    fit.resume(state_c, checkpoint.find_latest(prefix), RUN, net_c, CPU, loop_c.dist)
    assert (state_c.epoch, state_c.step) == (1, 2 * ACCUM)
    rest, _, stopped_at = fit.train_one_epoch(cfg, loop_c, state_c, AccumBatches(MICRO, 4 * ACCUM), epoch=1,
                                              skip=state_c.step)
    assert stopped_at is None
    assert rest.sums() == pytest.approx(whole.sums(), rel=1e-6)
    expected = learned_accum(net)
    for name, value in learned_accum(net_c).items():  # BatchNorm running statistics: see the phases tests above
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
    for name, value in state.ema.shadow.items():
        if not name.endswith(("running_mean", "running_var")):
            np.testing.assert_allclose(state_c.ema.shadow[name].asnumpy(), value.asnumpy(), rtol=1e-5, atol=1e-6)


def test_the_loss_scaler_and_ema_count_optimizer_steps_and_a_bad_micro_batch_skips_its_step(
        tmp_path, keep_signal_handlers):
    cfg = fit_config(tmp_path, MICRO, ACCUM, "--loss-scale", "dynamic")
    net = tiny_accum_net(tmp_path / "init.params")
    state, loop = start_accum(cfg, net)
    state.scaler.scale = 8.0
    updates = []
    state.ema.update = lambda: updates.append(1)
    before = learned_accum(net)
    batches = AccumBatches(MICRO, 2 * ACCUM)
    batches.batches[ACCUM + 1][0][0, 0, 0, 0] = np.nan  # the 2nd micro-batch of the 2nd optimizer step
    stats, _, _ = fit.train_one_epoch(cfg, loop, state, batches, epoch=1)
    assert len(updates) == 1  # the EMA follows the one applied optimizer step
    assert (state.scaler.bad_steps, state.scaler.scale) == (1, 4.0)  # one skipped step halves the scale once
    assert stats.steps == ACCUM and stats.samples == 2 * ACCUM * MICRO
    # the weights are those of the first optimizer step alone: rerun it
    net_b = tiny_accum_net(tmp_path / "init.params")
    state_b, loop_b = start_accum(cfg, net_b)
    state_b.scaler.scale = 8.0
    first_step = AccumBatches(MICRO, 2 * ACCUM)
    first_step.batches = first_step.batches[:ACCUM]
    fit.train_one_epoch(cfg, loop_b, state_b, first_step, epoch=1)
    assert state_b.scaler.clean_steps == 1
    after, expected = learned_accum(net), learned_accum(net_b)
    for name, value in after.items():
        assert not np.array_equal(value, before[name])
        np.testing.assert_array_equal(value, expected[name], err_msg=name)


def test_mixup_and_cutmix_switch_as_asked():
    """Added with the RSB-style recipes' pieces (CutMix, BCE, LAMB, stochastic depth)."""
    label = mx.nd.array([0, 1, 2, 3])
    data = constant_batch(4, "NCHW")
    rng = np.random.RandomState(1)
    for _ in range(5):  # switch probability 1: always CutMix (pixels are one image's or the other's)
        mixed, _ = fit.make_targets(label, 4, 0.0, 0.2, rng, data, cutmix=1.0, switch_prob=1.0)
        assert set(np.unique(mixed.asnumpy()[0])) <= {1.0, 4.0}
    mixed, target = fit.make_targets(label, 4, 0.0, 0.2, rng, data, cutmix=1.0, switch_prob=0.0)  # always mixup
    first = mixed.asnumpy()[0]
    assert np.ptp(first) < 1e-6  # a blend: one value over the whole image
    np.testing.assert_allclose(first.flat[0], target.asnumpy()[0, 0] * 1 + target.asnumpy()[0, 3] * 4, rtol=1e-5)


def numpy_bce(logits, target):
    return np.mean(np.maximum(logits, 0) - logits * target + np.log1p(np.exp(-np.abs(logits))), axis=1)


@pytest.mark.parametrize("thresh", [0.0, 0.2])
def test_bce_loss_and_gradient_equal_numpy(thresh):
    """Added with the RSB-style recipes' pieces (CutMix, BCE, LAMB, stochastic depth)."""
    rng = np.random.RandomState(2)
    logits = (rng.randn(5, 7) * 4).astype("float32")
    target = rng.dirichlet(np.ones(7) * 0.3, size=5).astype("float32")
    x = mx.nd.array(logits)
    x.attach_grad()
    loss_fn = fit.make_loss(fit_flags.FitConfig(loss="bce", bce_target_thresh=thresh))
    with autograd.record():
        loss = loss_fn(x, mx.nd.array(target))
    loss.backward()
    used = (target > thresh).astype("float32") if thresh else target
    np.testing.assert_allclose(loss.asnumpy(), numpy_bce(logits, used), rtol=1e-5, atol=1e-6)
    sigmoid = 1 / (1 + np.exp(-logits))
    np.testing.assert_allclose(x.grad.asnumpy(), (sigmoid - used) / 7, rtol=1e-4, atol=1e-6)
    assert isinstance(fit.make_loss(fit_flags.FitConfig()), gluon.loss.SoftmaxCrossEntropyLoss)


def test_model_best_holds_the_ema_weights_that_were_scored(tmp_path):
    """Found by the second newcomer walk (issue 26)."""
    import fit
    import models
    parsed = train.parse_args(["--kv-store", "local", "--dtype", "float32", "--batch-size", "8", "--num-epochs", "1",
                               "--lr", "0.2", "--warmup-epochs", "0", "--num-classes", "4", "--seed", "3",
                               "--ema-decay", "0.9", "--workspace", str(tmp_path), "--disp-batches", "0"])
    train.fill_hyper_parameters(parsed)
    args = train_config.from_args(parsed).fit
    net = tiny_net(tmp_path / "init.params")
    state, loop = start(args, net)
    fit.train_one_epoch(args, loop, state, Batches(), epoch=0)
    val = Batches(steps=2)
    scored = fit.validate(net, state.ema, val, CPU, loop.dist, "float32", no_metrics=False)
    live = weights(net)
    fit.save_checkpoint(str(tmp_path / "model"), net, state, RUN, epoch=1, step=0, keep_last=0, seed=3, best=True)
    assert weights(net).keys() == live.keys() and all(
        np.array_equal(value, live[name]) for name, value in weights(net).items())  # live weights put back
    best = tiny_net(tmp_path / "init.params")
    models.load_parameters(best, str(tmp_path / "model-best.params"), CPU)
    for name, value in weights(best).items():
        np.testing.assert_allclose(value, state.ema.shadow[name].asnumpy(), rtol=1e-6, err_msg=name)
    from rn50kit.scoring import scoring
    assert scoring.evaluate(best, val, CPU, loop.dist, "float32")["top1"] == scored["top1"]
    assert any(not np.allclose(value, live[name]) for name, value in weights(best).items())


def test_resuming_with_other_settings_is_noted():
    """Found by the second newcomer walk (issue 26)."""
    import fit
    saved = {"batch_size": 32, "image_shape": [3, 32, 32], "num_epochs": 16, "lr": 0.4, "dtype": "float32"}
    assert fit.changed_on_resume(saved, dict(saved)) == ""
    now = dict(saved, batch_size=64, image_shape=[3, 64, 64], num_epochs=30)
    assert fit.changed_on_resume(saved, now) == \
        "--batch-size 64 (was 32), --image-shape 3,64,64 (was 3,32,32), --num-epochs 30 (was 16)"
