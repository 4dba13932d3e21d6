"""fit.py's training loop driven in-process on one CPU context, as train.py builds it: the run's description, the
(state, loop) pair for a FitConfig and a network, and a tiny network with fixed batches for gradient accumulation
(unit/test_fit, test_outputs, e2e/test_mlperf, workers/hvd_accum_worker.py). The fixture that restores the signal
handlers fit.py installs, keep_signal_handlers, is in conftest.py."""
import mxnet as mx
import numpy as np
from mxnet import gluon

import fit
from rn50kit.training import distributed, precision
from rn50kit.training.state import RunInfo
from rn50kit.training.stop_signals import StopFlag

CPU = [mx.cpu()]
RUN = RunInfo(model_name="tiny", arch="resnetv15", command=["test"], report_path="report.json",
              record={"args": {}})


def start(cfg, net, num_classes):
    """fit.prepare's state and a Loop for ``net`` on the CPU, alone (no Horovod), without outputs."""
    dist = distributed.Distributed(None)
    state = fit.prepare(cfg, RUN, net, CPU, dist)
    loop = fit.Loop(net=net, ctxs=CPU, dist=dist, stop=StopFlag(dist), guard=precision.StatsGuard(net),
                    end_epoch=cfg.num_epochs, num_classes=num_classes)
    return state, loop


# --- gradient accumulation on a tiny network ---------------------------------------------------------------------

TINY_CLASSES, MICRO, ACCUM = 4, 4, 3


class ListedBatches:
    """An epoch's training iterator over fixed (images, labels) numpy pairs, the same every epoch; ``on_draw(i)`` is
    called as batch i is drawn (a test stops or checks the loop there)."""

    def __init__(self, batches, on_draw=None):
        self.batches, self.on_draw = batches, on_draw

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for i, (data, label) in enumerate(self.batches):
            if self.on_draw:
                self.on_draw(i)
            yield mx.io.DataBatch(data=[mx.nd.array(data)], label=[mx.nd.array(label)], pad=0)


class AccumBatches(ListedBatches):
    """``count`` batches of ``size`` cut from the same images (so 3 of 4 hold what 1 of 12 holds, in order)."""

    def __init__(self, size, count, on_draw=None, seed=0):
        rng = np.random.RandomState(seed)
        images = rng.uniform(-1, 1, (size * count, 3, 8, 8)).astype("float32")
        labels = rng.randint(0, TINY_CLASSES, size * count).astype("float32")
        super().__init__([(images[i * size:(i + 1) * size], labels[i * size:(i + 1) * size]) for i in range(count)],
                         on_draw)


def tiny_accum_net(init_file, batchnorm="none"):
    """Conv, optional BatchNorm ("live", or "frozen": normalising with its running statistics), pool, dense."""
    net = gluon.nn.HybridSequential(prefix="tiny_")
    with net.name_scope():
        net.add(gluon.nn.Conv2D(8, 3, padding=1))
        if batchnorm != "none":
            net.add(gluon.nn.BatchNorm(use_global_stats=batchnorm == "frozen"))
        net.add(gluon.nn.Activation("relu"), gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(TINY_CLASSES))
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


def fit_config(tmp_path, batch, accum, *extra):
    """The FitConfig train.py makes of a run of the tiny network in ``tmp_path`` (its workspace)."""
    import train
    from rn50kit.config import train_config
    parsed = train.parse_args(["--kv-store", "local", "--dtype", "float32", "--batch-size", str(batch),
                               "--grad-accum-steps", str(accum), "--num-epochs", "2", "--lr", "0.4",
                               "--warmup-epochs", "0.5", "--mixup", "0", "--num-classes", str(TINY_CLASSES),
                               "--seed", "3", "--ema-decay", "0.9", "--workspace", str(tmp_path),
                               "--disp-batches", "0", "--keep-last", "0", *extra])
    train.fill_hyper_parameters(parsed)
    return train_config.from_args(parsed).fit


def learned_accum(net):
    return {name: p.data().asnumpy() for name, p in net.collect_params().items()
            if not name.endswith(("running_mean", "running_var"))}


# --- CutMix's constant images (unit/test_fit, e2e/test_modern_recipes) --------------------------------------------

def constant_batch(n, layout, size=(16, 20)):
    """Image i is filled with the value i + 1, so every pixel tells which image it came from."""
    h, w = size
    values = np.arange(1, n + 1, dtype="float32")
    shape = (n, 3, h, w) if layout == "NCHW" else (n, h, w, 3)
    return mx.nd.array(np.broadcast_to(values.reshape(-1, 1, 1, 1), shape))
