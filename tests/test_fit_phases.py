"""The training loop's phases in process, on a tiny network: an epoch stopped by a signal, saved and resumed
through a real checkpoint ends exactly where the uninterrupted epoch does (weights, optimizer, EMA, metrics); and
validate() scores the EMA weights and gives the live ones back."""

import mxnet as mx
import numpy as np
import pytest

from rn50kit.training import checkpoint
from rn50kit.config import train_config
import fit
from rn50kit.training.state import gather_partial
import loop_harness
from loop_harness import CPU, RUN, keep_signal_handlers  # noqa: F401 (a fixture)
from rn50kit.scoring import scoring
import train

CLASSES, BATCH, STEPS, STOP_AFTER = 4, 8, 6, 3


class Batches:
    """The same STEPS batches every epoch; ``on_draw(i)`` is called as batch i is drawn."""

    def __init__(self, on_draw=None, steps=STEPS):
        rng = np.random.RandomState(0)
        self.batches = [(rng.uniform(-1, 1, (BATCH, 3, 8, 8)).astype("float32"),
                         rng.randint(0, CLASSES, BATCH).astype("float32")) for _ in range(steps)]
        self.on_draw = on_draw

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for i, (data, label) in enumerate(self.batches):
            if self.on_draw:
                self.on_draw(i)
            yield mx.io.DataBatch(data=[mx.nd.array(data)], label=[mx.nd.array(label)], pad=0)


def tiny_net(init_file):
    net = mx.gluon.nn.HybridSequential(prefix="tiny_")
    with net.name_scope():
        net.add(mx.gluon.nn.Conv2D(8, 3, padding=1), mx.gluon.nn.BatchNorm(), mx.gluon.nn.Activation("relu"),
                mx.gluon.nn.GlobalAvgPool2D(), mx.gluon.nn.Dense(CLASSES))
    net.initialize(mx.init.Xavier(), ctx=CPU)
    # Shapes by inference, as train.py does: an inference-mode forward would let oneDNN keep the arrays in its own
    # layout, after which the first network's BatchNorm statistics evolve differently from a loaded one's.
    net.infer_shape(mx.nd.zeros((1, 3, 8, 8)))
    for param in net.collect_params().values():
        param._finish_deferred_init()
    if not init_file.exists():
        net.save_parameters(str(init_file))
    net.load_parameters(str(init_file), ctx=CPU)
    net.hybridize(static_alloc=True, static_shape=True)
    return net


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
                        partials=gather_partial(first, loop_b.dist, "partial"))

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
