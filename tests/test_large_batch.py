"""The large-batch recipe's pieces in process, on tiny networks, against independent references: LARS against a
numpy implementation of its formula, the poly schedule against its formula, the mlperf recipe's LR table."""
import mxnet as mx
from mxnet import autograd, gluon
import numpy as np
import pytest

import distributed
import fit
import schedules


def small_net():
    net = gluon.nn.HybridSequential(prefix="small_")
    with net.name_scope():
        net.add(gluon.nn.Dense(8, in_units=4), gluon.nn.BatchNorm(in_channels=8), gluon.nn.Activation("relu"),
                gluon.nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier())
    return net


def lars_reference(weights, grads, moms, lr, wd, momentum, eta, eps, rescale):
    """One LARS step in numpy (You et al. 2017, as MXNet states it): weights (not BatchNorm gamma/beta, not
    biases) take lr x eta x |w| / (|g| + wd |w| + eps) and the weight decay; then SGD with momentum."""
    new = {}
    for name, w in weights.items():
        g = grads[name] * rescale
        plain = name.endswith(("gamma", "beta", "bias"))
        layer_lr, layer_wd = lr, (0.0 if plain else wd)
        if not plain:
            w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
            if w_norm > 0 and g_norm > 0:
                layer_lr = lr * eta * w_norm / (g_norm + wd * w_norm + eps)
        moms[name] = momentum * moms[name] - layer_lr * (layer_wd * w + g)
        new[name] = w + moms[name]
    return new


@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_lars_steps_equal_the_numpy_formula(eps):
    mx.random.seed(1)
    net = small_net()
    fit.set_wd_groups(net)
    wd, momentum, eta, batch = 5e-5, 0.9, 0.001, 6
    trainer = fit.make_trainer(net, distributed.Distributed(None), None, "lars", wd, momentum, lars_eta=eta,
                               lars_eps=eps)
    trained = {name: p for name, p in net.collect_params().items() if p.grad_req != "null"}
    assert sorted(trained) == ["small_batchnorm0_beta", "small_batchnorm0_gamma", "small_dense0_bias",
                               "small_dense0_weight", "small_dense1_bias", "small_dense1_weight"]
    moms = {name: np.zeros(p.shape, "float32") for name, p in trained.items()}
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(0)
    for step, lr in enumerate([2.0, 5.0, 3.0, 0.5]):  # large LRs, as LARS runs: the trust ratio makes them small
        x = mx.nd.array(rng.normal(size=(batch, 4)))
        y = mx.nd.array(rng.randint(0, 3, batch))
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        before = {name: p.data().asnumpy().copy() for name, p in trained.items()}
        grads = {name: p.grad().asnumpy().copy() for name, p in trained.items()}
        expected = lars_reference(before, grads, moms, lr, wd, momentum, eta, eps, 1.0 / batch)
        trainer.set_learning_rate(lr)
        trainer.step(batch)
        for name, p in trained.items():
            np.testing.assert_allclose(p.data().asnumpy(), expected[name], rtol=1e-5, atol=1e-7,
                                       err_msg=f"step {step}: {name}")
        # the trust ratio matters: a weight moved much less than plain SGD at this LR would move it
        sgd_move = lr * np.linalg.norm(grads["small_dense0_weight"] / batch)
        assert np.linalg.norm(expected["small_dense0_weight"] - before["small_dense0_weight"]) < 0.1 * sgd_move
