"""optimizers.SGD: MXNet's SGD, updated one weight at a time on CPU. Checked against a NumPy re-computation of
MXNet's momentum SGD and against MXNet's own (grouped) SGD, through a Gluon Trainer as fit.py drives it."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import optimizers

SHAPES = {"conv_weight": (8, 4, 3, 3), "bn_gamma": (8,), "bn_beta": (8,), "fc_weight": (10, 72), "fc_bias": (10,)}
LR, MOMENTUM, WD, BATCH = 0.1, 0.875, 3e-4, 4


def make_params(seed, dtype="float32"):
    rng = np.random.default_rng(seed)
    params = gluon.ParameterDict()
    for name, shape in SHAPES.items():
        param = params.get(name, shape=shape, dtype=dtype)
        param.initialize(mx.init.Constant(0))
        param.set_data(mx.nd.array(rng.normal(size=shape), dtype=dtype))
        if name.endswith(("gamma", "beta", "bias")):  # as fit.set_wd_groups does
            param.wd_mult = 0.0
        param.lr_mult = 0.5 if name == "fc_weight" else 1.0  # as a fine-tuned head's
    return params


def gradient_steps(seed, steps):
    rng = np.random.default_rng(seed + 100)
    return [{name: rng.normal(size=shape) for name, shape in SHAPES.items()} for _ in range(steps)]


def backward(params, gradients):
    """A backward pass whose gradients are ``gradients``: d/dw sum(w * g) = g."""
    with autograd.record():
        loss = mx.nd.add_n(*[(params[name].data() * mx.nd.array(grad, dtype=params[name].dtype)).sum()
                             for name, grad in gradients.items()])
    loss.backward()


def run(optimizer, params, gradients, clip=None, momentum=MOMENTUM):
    """Drive a Gluon Trainer over ``gradients`` (one dict per step); returns the final weights."""
    kwargs = dict(learning_rate=LR, momentum=momentum, wd=WD, multi_precision=True)
    if clip:
        kwargs["clip_gradient"] = clip
    trainer = gluon.Trainer(params, optimizer(**kwargs) if callable(optimizer) else optimizer,
                            None if callable(optimizer) else kwargs)
    for step in gradients:
        backward(params, step)
        trainer.step(BATCH)
    return {name: params[name].data().astype("float64").asnumpy() for name in SHAPES}, trainer


def numpy_sgd(params, gradients, clip=None, momentum=MOMENTUM):
    """MXNet's momentum SGD in float64: mom = m * mom - lr * wd * w - lr * clip(grad / batch); w += mom."""
    weights = {name: params[name].data().asnumpy().astype(np.float64) for name in SHAPES}
    moms = {name: np.zeros(shape) for name, shape in SHAPES.items()}
    for step in gradients:
        for name, grad in step.items():
            lr, wd = LR * params[name].lr_mult, WD * params[name].wd_mult
            g = grad / BATCH
            if clip:
                g = np.clip(g, -clip, clip)
            moms[name] = momentum * moms[name] - lr * wd * weights[name] - lr * g
            weights[name] = weights[name] + moms[name]
    return weights


@pytest.mark.parametrize("clip, momentum", [(None, MOMENTUM), (0.05, MOMENTUM), (None, 0.0)])
def test_matches_numpy_and_mxnets_sgd(clip, momentum):
    gradients = gradient_steps(0, 4)
    ours, _ = run(optimizers.SGD, make_params(0), gradients, clip, momentum)
    expected = numpy_sgd(make_params(0), gradients, clip, momentum)
    mxnets, _ = run("sgd", make_params(0), gradients, clip, momentum)
    for name in SHAPES:
        np.testing.assert_allclose(ours[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(ours[name], mxnets[name], rtol=1e-6, atol=1e-7, err_msg=name)
    assert not np.allclose(ours["conv_weight"], make_params(0)["conv_weight"].data().asnumpy())  # it moved


def operators_run(optimizer, folder):
    """The names of the operators MXNet ran for four Trainer steps with ``optimizer`` (its profiler's counts)."""
    params, gradients = make_params(1), gradient_steps(1, 4)
    mx.profiler.set_config(profile_imperative=True, aggregate_stats=True, filename=str(folder / "profile.json"))
    mx.profiler.set_state("run")
    try:
        run(optimizer, params, gradients)
        mx.nd.waitall()
    finally:
        mx.profiler.set_state("stop")
    table = mx.profiler.dumps(reset=True)
    return {line.split()[0] for line in table.splitlines() if line.strip() and "update" in line.split()[0]}


def test_cpu_updates_one_weight_at_a_time(tmp_path):
    """The reason for the class: MXNet's SGD runs its grouped kernel even for one weight; ours the per-weight one."""
    assert "multi_sgd_mom_update" in operators_run("sgd", tmp_path)
    ours = operators_run(optimizers.SGD, tmp_path)
    assert "sgd_mom_update" in ours and "multi_sgd_mom_update" not in ours


def test_float16_master_weights_take_mxnets_path():
    gradients = gradient_steps(2, 3)
    ours, _ = run(optimizers.SGD, make_params(2, "float16"), gradients)
    mxnets, _ = run("sgd", make_params(2, "float16"), gradients)
    for name in SHAPES:
        np.testing.assert_array_equal(ours[name], mxnets[name], err_msg=name)


def test_states_saved_and_loaded_continue_exactly(tmp_path):
    """A resumed run (fit.py's checkpoints: Trainer.save_states/load_states) continues as one that never stopped,
    and states saved by MXNet's own SGD (checkpoints written before this class) load into a trainer of ours."""
    gradients = gradient_steps(3, 6)
    straight, _ = run(optimizers.SGD, make_params(3), gradients)
    for first in (optimizers.SGD, "sgd"):
        params = make_params(3)
        _, trainer = run(first, params, gradients[:3])
        trainer.save_states(str(tmp_path / "states"))
        resumed_params = gluon.ParameterDict()
        for name in SHAPES:
            resumed_params.get(name, shape=SHAPES[name]).initialize(mx.init.Constant(0))
            resumed_params[name].set_data(params[name].data())
            resumed_params[name].wd_mult, resumed_params[name].lr_mult = params[name].wd_mult, params[name].lr_mult
        resumed = gluon.Trainer(resumed_params, optimizers.SGD(learning_rate=LR, momentum=MOMENTUM, wd=WD,
                                                                multi_precision=True))
        optimizers.load_states(resumed, str(tmp_path / "states"))
        assert type(resumed._optimizer) is optimizers.SGD  # MXNet's load_states would put back the pickled class
        for step in gradients[3:]:
            backward(resumed_params, step)
            resumed.step(BATCH)
        for name in SHAPES:
            np.testing.assert_allclose(resumed_params[name].data().asnumpy(), straight[name], rtol=1e-6,
                                       atol=1e-7, err_msg=f"{first}: {name}")
