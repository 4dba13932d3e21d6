"""optimizers SGD, LARS and LAMB, as fit.py drives them through a Gluon Trainer: against NumPy re-computations
of their formulas and MXNet's own optimizers."""
import json
import struct

import convert_states
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from rn50kit.training import distributed, optimizers
from rn50kit.weights import optimizer_state


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
    optimizers.set_wd_groups(net)
    wd, momentum, eta, batch = 5e-5, 0.9, 0.001, 6
    trainer = optimizers.make_trainer(net, distributed.Distributed(None), None, "lars", wd, momentum, lars_eta=eta,
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


def numpy_lamb_step(w, grads, lr, wd, beta1=0.9, beta2=0.999, eps=1e-6):
    """LAMB as timm's (timm/optim/lamb.py) with bias correction: Adam's direction plus weight decay, scaled by the
    trust ratio ||w|| / ||direction|| (1 where either is 0) only when the weight decays (wd != 0)."""
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        direction = (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps) + wd * w
        r1, r2 = np.linalg.norm(w), np.linalg.norm(direction)
        w = w - lr * (r1 / r2 if r1 > 0 and r2 > 0 and wd != 0 else 1.0) * direction
    return w


def test_lamb_steps_equal_numpy():
    """Added with the RSB-style recipes' pieces (CutMix, BCE, LAMB, stochastic depth)."""
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
    """Added with the RSB-style recipes' pieces (CutMix, BCE, LAMB, stochastic depth)."""
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
    np.testing.assert_allclose(net.weight.data().asnumpy(), numpy_lamb_step(w0, [g], lr=0.1, wd=0.0), rtol=1e-4)


SHAPES = {"conv_weight": (8, 4, 3, 3), "bn_gamma": (8,), "bn_beta": (8,), "fc_weight": (10, 72), "fc_bias": (10,)}


LR, MOMENTUM, WD, BATCH = 0.1, 0.875, 3e-4, 4


ETA, EPS = 0.02, 1e-7  # LARS's


def make_params(seed, dtype="float32", zero=()):
    rng = np.random.default_rng(seed)
    params = gluon.ParameterDict()
    for name, shape in SHAPES.items():
        param = params.get(name, shape=shape, dtype=dtype)
        param.initialize(mx.init.Constant(0))
        if name not in zero:  # (a zero weight: LARS and LAMB keep the LR as it is)
            param.set_data(mx.nd.array(rng.normal(size=shape), dtype=dtype))
        if name.endswith(("gamma", "beta", "bias")):  # as optimizers.set_wd_groups does
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


def numpy_sgd(params, gradients, clip=None, momentum=MOMENTUM, lars_eta=None):
    """MXNet's momentum SGD in float64: mom = m * mom - lr * wd * w - lr * clip(grad / batch); w += mom.
    With ``lars_eta``, MXNet's LARS (multi_lars, then this): weights other than gamma, beta and bias step with
    lr x eta x |w| / (|g| / BATCH + wd x |w| + eps), where both norms are non-zero."""
    weights = {name: params[name].data().asnumpy().astype(np.float64) for name in SHAPES}
    moms = {name: np.zeros(shape) for name, shape in SHAPES.items()}
    for step in gradients:
        for name, grad in step.items():
            lr, wd = LR * params[name].lr_mult, WD * params[name].wd_mult
            w_norm, g_norm = np.linalg.norm(weights[name]), np.linalg.norm(grad) / BATCH
            if lars_eta and not name.endswith(("gamma", "beta", "bias")) and w_norm > 0 and g_norm > 0:
                lr = lr * lars_eta * w_norm / (g_norm + wd * w_norm + EPS)
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


def operators_run(optimizer, folder, name="sgd"):
    """The names of the operators MXNet ran for four Trainer steps with ``optimizer`` (its profiler's counts)."""
    params, gradients = make_params(1), gradient_steps(1, 4)
    mx.profiler.set_config(profile_imperative=True, aggregate_stats=True, filename=str(folder / "profile.json"))
    mx.profiler.set_state("run")
    try:
        if name == "sgd":
            run(optimizer, params, gradients)
        else:
            run_named(optimizer, name, params, gradients)
        mx.nd.waitall()
    finally:
        mx.profiler.set_state("stop")
    table = mx.profiler.dumps(reset=True)
    return {line.split()[0] for line in table.splitlines() if line.strip() and line.split()[0].islower()}


def test_cpu_updates_one_weight_at_a_time(tmp_path):
    """The reason for the class: MXNet's SGD runs its grouped kernel even for one weight; ours the per-weight one."""
    assert "multi_sgd_mom_update" in operators_run("sgd", tmp_path)
    ours = operators_run(optimizers.SGD, tmp_path)
    assert "sgd_mom_update" in ours and "multi_sgd_mom_update" not in ours


# LARS and LAMB, with optimizers.optimizer_params' settings (LARS reads which weights keep their LR from the names)


def named_kwargs(name, params, clip=None):
    kwargs = dict(learning_rate=LR, wd=WD, multi_precision=True, rescale_grad=1.0 / BATCH)
    if name == "lars":
        kwargs.update(momentum=MOMENTUM, eta=ETA, eps=EPS, momentum_correction=False,
                      param_idx2name=dict(enumerate(sorted(params.keys()))))
    if clip:
        kwargs["clip_gradient"] = clip
    return kwargs


def run_named(optimizer, name, params, gradients, clip=None):
    """A Trainer with ``optimizer`` (a class of ours, or ``name`` for MXNet's) over ``gradients``; the final weights."""
    kwargs = named_kwargs(name, params, clip)
    trainer = gluon.Trainer(params, optimizer(**kwargs) if callable(optimizer) else name,
                            None if callable(optimizer) else kwargs)
    for step in gradients:
        backward(params, step)
        trainer.step(1)  # rescale_grad is the optimizer's 1 / BATCH (the Trainer's own would override it)
    return {name: params[name].data().astype("float64").asnumpy() for name in SHAPES}, trainer


def numpy_lars(params, gradients, clip=None):
    return numpy_sgd(params, gradients, clip, lars_eta=ETA)


def numpy_lamb(params, gradients, clip=None, beta1=0.9, beta2=0.999, eps=1e-6):
    """timm's LAMB in float64 (numpy_lamb_step): weights without weight decay (gamma, beta, bias) take the plain
    step, the others theirs scaled by |w| / |step| where both are non-zero."""
    weights = {}
    for name in SHAPES:
        grads = [np.clip(step[name] / BATCH, -clip, clip) if clip else step[name] / BATCH for step in gradients]
        weights[name] = numpy_lamb_step(params[name].data().asnumpy().astype(np.float64), grads,
                                        LR * params[name].lr_mult, WD * params[name].wd_mult, beta1, beta2, eps)
    return weights


def decay_free(param):
    return param.endswith(("gamma", "beta", "bias"))


NAMED = {"lars": (optimizers.LARS, numpy_lars), "lamb": (optimizers.LAMB, numpy_lamb)}


@pytest.mark.parametrize("name", sorted(NAMED))
@pytest.mark.parametrize("clip", [None, 0.05])
def test_lars_and_lamb_match_numpy_and_mxnets(name, clip):
    ours_class, reference = NAMED[name]
    gradients = gradient_steps(4, 4)
    zero = ("fc_bias", "fc_weight")  # a zero weight keeps the plain LR (LARS and LAMB alike)
    ours, _ = run_named(ours_class, name, make_params(4, zero=zero), gradients, clip)
    expected = reference(make_params(4, zero=zero), gradients, clip)
    mxnets, _ = run_named(None, name, make_params(4, zero=zero), gradients, clip)
    for param in SHAPES:
        np.testing.assert_allclose(ours[param], expected[param], rtol=1e-5, atol=1e-6, err_msg=param)
        if name == "lars" or not decay_free(param):  # MXNet's LAMB adapts every step (timm's rule: below)
            np.testing.assert_allclose(ours[param], mxnets[param], rtol=1e-5, atol=1e-6, err_msg=param)
    for param in SHAPES:
        assert not np.allclose(ours[param], make_params(4, zero=zero)[param].data().asnumpy()), param  # it moved


def test_lars_and_lamb_take_norms_by_blas_and_update_per_weight(tmp_path):
    """The reason for the classes: MXNet's LARS takes its norms with multi_sum_sq and updates in groups, its LAMB
    takes norms with `norm` or updates in groups of 45 (multi_lamb_update): scalar loops on CPU. Ours: dot products,
    and the per-weight kernels."""
    mxnets_lars, ours_lars = operators_run("lars", tmp_path, "lars"), operators_run(optimizers.LARS, tmp_path, "lars")
    assert {"multi_sum_sq", "preloaded_multi_sgd_mom_update"} <= mxnets_lars
    assert "dot" in ours_lars and "sgd_mom_update" in ours_lars
    assert not ours_lars & {"multi_sum_sq", "preloaded_multi_sgd_mom_update", "norm"}
    mxnets_lamb, ours_lamb = operators_run("lamb", tmp_path, "lamb"), operators_run(optimizers.LAMB, tmp_path, "lamb")
    assert "_multi_lamb_update" in mxnets_lamb
    assert {"dot", "lamb_update_phase1", "lamb_update_phase2"} <= ours_lamb
    assert not ours_lamb & {"_multi_lamb_update", "norm"}


def test_create_gives_ours_where_we_have_one():
    for name, ours in [("sgd", optimizers.SGD), ("lars", optimizers.LARS), ("lamb", optimizers.LAMB)]:
        assert type(optimizers.create(name, learning_rate=0.1)) is ours
    assert type(optimizers.create("nag", learning_rate=0.1, momentum=0.9)) is mx.optimizer.NAG


def test_float16_master_weights_take_mxnets_path():
    gradients = gradient_steps(2, 3)
    ours, _ = run(optimizers.SGD, make_params(2, "float16"), gradients)
    mxnets, _ = run("sgd", make_params(2, "float16"), gradients)
    for name in SHAPES:
        np.testing.assert_array_equal(ours[name], mxnets[name], err_msg=name)


def save_and_restore(trainer, resumed, path, mxnets=False):
    """The state of ``trainer`` into ``resumed`` as a checkpoint carries it: arrays in an NDArray file and plain
    values (optimizer_state); ``mxnets``: through MXNet's own pickle (older checkpoints) and the converter."""
    if mxnets:
        trainer.save_states(str(path))
        values = convert_states.convert_file(str(path))
    else:
        values = json.loads(json.dumps(optimizer_state.save(trainer, str(path))))  # as the state file keeps them
    optimizer_state.restore(resumed, str(path), values, "model-0001.state.json")


def saved_from_gpu(array, getstate=mx.nd.NDArray.__getstate__):
    """``array``'s pickled state as a GPU's array would have it: MXNet 1.9.1's NDArray::Save writes the magic, the
    storage type, the shape (ndim, then int64 sizes) and then the context, (dev_type, dev_id): gpu(0) is (2, 0)."""
    raw = getstate(array)["handle"]
    at = 12 + 8 * struct.unpack_from("<i", raw, 8)[0]
    assert struct.unpack_from("<ii", raw, at) == (1, 0)  # cpu(0), where it was saved
    struct.pack_into("<ii", raw, at, 2, 0)
    return {"handle": raw}


def test_a_gpu_checkpoints_states_convert_on_this_cpu_build(tmp_path, monkeypatch):
    """Issue 55: convert_states.py said a GPU checkpoint must be converted where its GPUs are. MXNet's CPU build
    reads a GPU array into host memory (NDArray::Load without CUDA): the pickle of a GPU run converts here, to
    the same arrays and values as the same states saved from the CPU."""
    _, trainer = run(optimizers.SGD, make_params(3), gradient_steps(3, 2))
    trainer.save_states(str(tmp_path / "cpu.states"))
    with monkeypatch.context() as patched:
        patched.setattr(mx.nd.NDArray, "__getstate__", saved_from_gpu)
        trainer.save_states(str(tmp_path / "gpu.states"))
    assert (tmp_path / "gpu.states").read_bytes() != (tmp_path / "cpu.states").read_bytes()
    values = [convert_states.convert_file(str(tmp_path / name)) for name in ("cpu.states", "gpu.states")]
    assert values[0] == values[1] and values[0]["states"]
    from_cpu, from_gpu = (mx.nd.load(str(tmp_path / name)) for name in ("cpu.states", "gpu.states"))
    assert sorted(from_cpu) == sorted(from_gpu) and from_cpu
    for key, array in from_gpu.items():
        assert array.context == mx.cpu()
        np.testing.assert_array_equal(array.asnumpy(), from_cpu[key].asnumpy(), err_msg=key)


def test_states_saved_and_loaded_continue_exactly(tmp_path):
    """A resumed run (fit.py's checkpoints: optimizer_state.save/restore) continues as one that never stopped, and
    states saved by MXNet's own SGD (checkpoints written before this class, converted) load into a trainer of
    ours."""
    gradients = gradient_steps(3, 6)
    straight, _ = run(optimizers.SGD, make_params(3), gradients)
    for first in (optimizers.SGD, "sgd"):
        params = make_params(3)
        _, trainer = run(first, params, gradients[:3])
        resumed_params = gluon.ParameterDict()
        for name in SHAPES:
            resumed_params.get(name, shape=SHAPES[name]).initialize(mx.init.Constant(0))
            resumed_params[name].set_data(params[name].data())
            resumed_params[name].wd_mult, resumed_params[name].lr_mult = params[name].wd_mult, params[name].lr_mult
        resumed = gluon.Trainer(resumed_params, optimizers.SGD(learning_rate=LR, momentum=MOMENTUM, wd=WD,
                                                                multi_precision=True))
        save_and_restore(trainer, resumed, tmp_path / "states", mxnets=first == "sgd")
        assert type(resumed._optimizer) is optimizers.SGD
        for step in gradients[3:]:
            backward(resumed_params, step)
            resumed.step(BATCH)
        for name in SHAPES:
            np.testing.assert_array_equal(resumed_params[name].data().asnumpy(), straight[name],
                                          err_msg=f"{first}: {name}")


@pytest.mark.parametrize("name", sorted(NAMED))
def test_lars_and_lamb_states_load_into_ours_and_continue(name, tmp_path):
    """Checkpoints of MXNet's LARS/LAMB (written before these classes, converted) and of ours resume into ours
    exactly (LAMB's bias correction counts its updates: the counts come back too)."""
    ours_class = NAMED[name][0]
    gradients = gradient_steps(5, 6)
    straight, _ = run_named(ours_class, name, make_params(5), gradients)
    for first in (ours_class, None):
        params = make_params(5)
        _, trainer = run_named(first, name, params, gradients[:3])
        resumed_params = make_params(5)
        for param in SHAPES:
            resumed_params[param].set_data(params[param].data())
        resumed = gluon.Trainer(resumed_params, ours_class(**named_kwargs(name, resumed_params)))
        save_and_restore(trainer, resumed, tmp_path / "states", mxnets=first is None)
        assert type(resumed._optimizer) is ours_class
        for step in gradients[3:]:
            backward(resumed_params, step)
            resumed.step(1)
        for param in SHAPES:  # MXNet's first steps take their norms otherwise: a last bit may differ
            if first is None and name == "lamb" and decay_free(param):
                continue  # MXNet's LAMB took its first steps with the trust ratio (timm's rule: without)
            np.testing.assert_allclose(resumed_params[param].data().asnumpy(), straight[param],
                                       rtol=0 if first else 1e-6, atol=0 if first else 1e-7,
                                       err_msg=f"{first}: {param}")


@pytest.mark.parametrize("dtype, correction", [("float16", False), ("float32", True)])
def test_lars_takes_mxnets_path_in_mxnets_groups(dtype, correction):
    """float16 master weights (a GPU's) and momentum correction take MXNet's LARS path, and in MXNet's groups: a step
    of ours is one call of every weight, and MXNet's grouped kernels hold at most 60 (more is memory corruption)."""
    names = [f"block{i:02d}_conv_weight" for i in range(70)] + ["bn_gamma", "fc_bias"]
    results = []
    for optimizer in (optimizers.LARS, None):
        params = gluon.ParameterDict()
        for name in names:
            params.get(name, shape=(3, 2), dtype=dtype).initialize(mx.init.Constant(0.5))
        kwargs = dict(learning_rate=LR, wd=WD, multi_precision=True, rescale_grad=1.0 / BATCH, momentum=MOMENTUM,
                      eta=ETA, eps=EPS, momentum_correction=correction,
                      param_idx2name=dict(enumerate(sorted(params.keys()))))
        trainer = gluon.Trainer(params, optimizer(**kwargs) if optimizer else "lars", None if optimizer else kwargs)
        step_rng = np.random.default_rng(7)
        for step in range(3):
            trainer.set_learning_rate(LR * (step + 1))  # a rising LR: the momentum correction has work to do
            with autograd.record():
                loss = mx.nd.add_n(*[(params[name].data() * mx.nd.array(step_rng.normal(size=(3, 2)), dtype=dtype))
                                     .sum() for name in names])
            loss.backward()
            trainer.step(1)
        results.append({name: params[name].data().asnumpy() for name in names})
    for name in names:
        np.testing.assert_array_equal(results[0][name], results[1][name], err_msg=name)
    assert not np.allclose(results[0][names[0]], 0.5)


@pytest.mark.parametrize("path", ["cpu", "grouped", "grouped-float16"])
def test_lamb_follows_timms_rule_for_weights_without_decay(path, monkeypatch):
    """timm's LAMB adapts the step by the trust ratio only where the weight decays: gamma, beta and biases (wd_mult
    0) take the plain Adam step. On CPU float32 (per-weight kernels) and on a GPU's grouped kernels
    (multi_lamb_update; multi_mp_lamb_update for float16 master weights), forced here on the CPU."""
    dtype = "float16" if path == "grouped-float16" else "float32"
    if path == "grouped":
        monkeypatch.setattr(optimizers, "cpu_dense", lambda weights, grads: False)
    zero = ("bn_beta", "fc_bias")  # zero-initialised, as every block's beta
    gradients = [{name: g.astype(dtype).astype(np.float64) for name, g in step.items()}
                 for step in gradient_steps(6, 5)]
    ours, _ = run_named(optimizers.LAMB, "lamb", make_params(6, dtype, zero=zero), gradients)
    expected = numpy_lamb(make_params(6, dtype, zero=zero), gradients)
    tolerance = dict(rtol=2e-3, atol=2e-3) if dtype == "float16" else dict(rtol=1e-5, atol=1e-6)
    for param in SHAPES:
        np.testing.assert_allclose(ours[param], expected[param], err_msg=param, **tolerance)


def test_lamb_moves_a_zero_beta_as_timm_does():
    """The issue's measure: a zero beta, LR 0.01, a constant gradient, 10 steps: timm's LAMB moves it by the plain
    Adam step, about -0.1 (MXNet's, scaled by the ratio of its tiny norm: -0.011)."""
    params = gluon.ParameterDict()
    params.get("bn_beta", shape=(8,)).initialize(mx.init.Constant(0))
    params["bn_beta"].wd_mult = 0.0
    trainer = gluon.Trainer(params, optimizers.LAMB(learning_rate=0.01, wd=WD, multi_precision=True))
    grad = np.linspace(0.5, 1.5, 8)
    for _ in range(10):
        with autograd.record():
            loss = (params["bn_beta"].data() * mx.nd.array(grad)).sum()
        loss.backward()
        trainer.step(1)
    expected = numpy_lamb_step(np.zeros(8), [grad] * 10, lr=0.01, wd=0.0)
    np.testing.assert_allclose(params["bn_beta"].data().asnumpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(expected, -0.1, rtol=1e-3)


# ---- the registry (rn50kit/config/optimizer_registry.py): every optimizer built from its entry -------------------
def attributes(optimizer):
    return {key: value for key, value in vars(optimizer).items()
            if isinstance(value, (int, float, str, bool, type(None), dict)) and key != "param_dict"}


@pytest.mark.parametrize("name", ["sgd", "nag", "lars", "lamb"])
def test_the_registry_builds_what_the_flags_built_before(name):
    """Users see no change: each built-in entry makes the optimizer MXNet's name and the former parameters made."""
    from rn50kit.config.optimizer_registry import Knobs
    net = small_net()
    knobs = Knobs(wd=1e-4, momentum=0.9, lars_eta=0.002, lars_eps=1e-5)
    built = optimizers.build(name, knobs, sorted(net.collect_params().keys()))
    before = optimizers.create(name, **optimizers.optimizer_params(net, name, 1e-4, 0.9, 0.002, 1e-5))
    assert type(built) is type(before) and attributes(built) == attributes(before)


def test_the_generic_flags_reach_the_optimizers_that_read_them():
    from rn50kit.config import optimizer_registry, train_config, train_flags
    net = small_net()
    names = sorted(net.collect_params().keys())

    def built(*argv):
        args = train_flags.parse_args(list(argv))
        train_flags.fill_hyper_parameters(args)
        fit_cfg = train_config.from_args(args).fit
        return optimizers.build(fit_cfg.optimizer, optimizer_registry.knobs_of(fit_cfg), names)
    lamb = built("--optimizer", "lamb", "--opt-betas", "0.8,0.95", "--opt-eps", "1e-8")
    assert (lamb.beta1, lamb.beta2, lamb.epsilon) == (0.8, 0.95, 1e-8)
    lamb = built("--optimizer", "lamb")  # MXNet's (and timm's) own
    assert (lamb.beta1, lamb.beta2, lamb.epsilon) == (0.9, 0.999, 1e-6)
    assert built("--optimizer", "lars", "--opt-eps", "1e-7").eps == 1e-7
    assert built("--optimizer", "lars", "--lars-eps", "1e-6").eps == 1e-6  # the former flag, kept
    assert built("--optimizer", "sgd", "--mom", "0.5").momentum == 0.5
