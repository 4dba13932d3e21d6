"""ema: the average of the weights, on devices that leave out cpu(0) as GPUs do, float32 and float16 weights,
against numpy's exponential average; swapped in and out, saved and loaded."""
import mxnet as mx
import numpy as np
from mxnet import gluon

from rn50kit.hardware import memory
from rn50kit.training.ema import EMA, MULTI_SGD_MAX_ARRAYS

# Two devices without cpu(0), as a network on [gpu(0), gpu(1)] has none: Parameter.data() without a context asks
# for the current context, cpu(0).
DEVICES = [mx.cpu(1), mx.cpu(2)]
ARRAYS = MULTI_SGD_MAX_ARRAYS + 7  # more than one fused call per dtype


class ManyArrays(gluon.Block):
    """ARRAYS float32 and ARRAYS float16 parameters of assorted shapes."""

    def __init__(self):
        super().__init__(prefix="many_")
        for i in range(ARRAYS):
            for dtype in ("float32", "float16"):
                self.params.get(f"{dtype}_{i}", shape=(1 + i % 5, 3), dtype=dtype, init=mx.init.Uniform(1.0))


def many_arrays():
    net = ManyArrays()
    net.collect_params().initialize(ctx=DEVICES)
    return net


def weights(net):
    """Each parameter's value (the same on every device), as numpy float64."""
    values = {}
    for name, p in net.collect_params().items():
        copies = [a.asnumpy() for a in p.list_data()]
        assert all(np.array_equal(c, copies[0]) for c in copies[1:]), name
        values[name] = copies[0].astype(np.float64)
    return values


def move(net, rng):
    for p in net.collect_params().values():
        p.set_data(mx.nd.array(rng.uniform(-2, 2, p.shape), dtype=p.dtype))


def test_ema_follows_numpy_exponential_average_on_devices_without_cpu0():
    net, rng, decay = many_arrays(), np.random.RandomState(0), 0.8
    ema = EMA(net, decay)
    expected = weights(net)
    for _ in range(4):
        move(net, rng)
        live = weights(net)
        ema.update()
        expected = {name: decay * expected[name] + (1 - decay) * live[name] for name in expected}
        after = weights(net)
        assert all(np.array_equal(after[name], live[name]) for name in live)  # the live weights untouched
    for name, value in expected.items():
        assert ema.shadow[name].dtype == np.float32 and ema.shadow[name].context == DEVICES[0]
        np.testing.assert_allclose(ema.shadow[name].asnumpy(), value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_swap_puts_the_average_on_every_device_and_back(tmp_path):
    net, rng = many_arrays(), np.random.RandomState(1)
    ema = EMA(net, 0.5)
    move(net, rng)
    ema.update()
    averages = {name: value.asnumpy() for name, value in ema.shadow.items()}
    live = weights(net)
    ema.swap()  # validation runs on the averages (weights() checks every device holds them)
    for name, value in weights(net).items():
        dtype = net.collect_params()[name].dtype
        np.testing.assert_array_equal(value, averages[name].astype(dtype), err_msg=name)
    ema.swap()
    for name, value in weights(net).items():
        np.testing.assert_array_equal(value, live[name], err_msg=name)
    # what a checkpoint writes, loaded into a fresh average
    mx.nd.save(str(tmp_path / "ema.params"), ema.saveable())
    fresh = EMA(net, 0.5)
    fresh.load(str(tmp_path / "ema.params"))
    for name, value in averages.items():
        np.testing.assert_array_equal(fresh.shadow[name].asnumpy(), value, err_msg=name)


def test_parameter_count_of_a_network_on_devices_without_cpu0():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(4, 3, in_channels=3), gluon.nn.BatchNorm(in_channels=4), gluon.nn.Dense(5, in_units=9))
    net.initialize(ctx=DEVICES)
    shapes = [(4, 3, 3, 3), (4,), (4,), (4,), (4,), (4,), (5, 9), (5,)]
    assert memory.parameter_count(net) == sum(int(np.prod(s)) for s in shapes)
