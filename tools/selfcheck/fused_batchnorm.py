"""NVIDIA's fused BatchNorm+ReLU and BatchNorm+add+ReLU (its MXNet builds) against the plain ops, same weights:
logits, every gradient, and the time of a forward and backward pass."""
import os
import time

from rn50kit.hardware import devices
from selfcheck import NOT_APPLICABLE
from selfcheck.numerics import as_input, forward_backward, relative_error

FUSED_FORWARD_TOLERANCE = 1e-2  # fused vs plain ops in the same precision: relative L2 error of the logits


FUSED_BACKWARD_TOLERANCE = 5e-2  # of each parameter's gradient (the worst one)


def fused_pair(machine, ctx, dtype, layout, channels, depth):
    """(plain, fused) ResNets of the kit with the same weights: the plain one initialised with every BatchNorm's
    gamma and beta drawn at random (the last gamma of a block is 0 at initialisation, which would hide the fused
    add), saved under the parameters' names and loaded into the fused one as a checkpoint is."""
    import mxnet as mx

    import models
    from rn50kit.graph.parameters import load_parameters
    nets = [models.get_model(f"resnet{depth}_v1.5", num_classes=10, layout=layout, input_layout=layout,
                             in_channels=channels, dtype=dtype, fuse_bn_relu=fuse, fuse_bn_add_relu=fuse)
            for fuse in (False, True)]
    plain, fused = nets
    plain.initialize(mx.init.Xavier(), ctx=ctx)
    for name, param in plain.collect_params().items():
        if name.endswith(("_gamma", "_beta")):
            low, high = (0.5, 1.5) if name.endswith("_gamma") else (-0.2, 0.2)
            param.set_data(mx.nd.random.uniform(low, high, shape=param.shape, ctx=ctx, dtype=param.dtype))
    path = os.path.join(machine.workdir, f"fused-{depth}.params")
    mx.nd.save(path, {name: param.data(ctx) for name, param in plain.collect_params().items()})
    fused.initialize(ctx=ctx)
    load_parameters(fused, path, ctx)
    return plain, fused


def gradients(net, ctx):
    return {name: param.grad(ctx).astype("float32").asnumpy() for name, param in net.collect_params().items()
            if param.grad_req != "null"}


def step_time(net, x, y, steps):
    """Seconds per forward and backward pass (a training step without the update)."""
    import mxnet as mx
    from mxnet import autograd, gluon
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for i in range(steps + 1):
        if i == 1:  # the first pass builds the graph
            mx.nd.waitall()
            start = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(x).astype("float32"), y)
        loss.backward()
    mx.nd.waitall()
    return (time.perf_counter() - start) / steps


def compare_fused(machine, ctx, dtype, layout, channels, depth, size, batch, steps=10):
    """The network with this MXNet's fused BatchNorm+ReLU and BatchNorm+add+ReLU against the plain ops, same
    weights: training-mode logits and every parameter's gradient, and the time of a forward and backward pass."""
    import mxnet as mx
    import numpy as np
    plain, fused = fused_pair(machine, ctx, dtype, layout, channels, depth)
    rng = np.random.RandomState(0)
    images = as_input(rng.uniform(-2, 2, (batch, 3, size, size)).astype("float32"), layout, channels)
    labels = rng.randint(0, 10, batch)
    results = []
    for net in (plain, fused):
        net.hybridize(static_alloc=True, static_shape=True)
        logits, _ = forward_backward(net, images, labels, ctx, dtype)
        results.append((logits, gradients(net, ctx)))
    (plain_logits, plain_grads), (fused_logits, fused_grads) = results
    forward = relative_error(fused_logits, plain_logits)
    errors = {name: relative_error(fused_grads[name], grad) for name, grad in plain_grads.items()}
    worst = max(errors, key=errors.get)
    x, y = mx.nd.array(images, ctx=ctx, dtype=dtype), mx.nd.array(labels, ctx=ctx)
    plain_s, fused_s = step_time(plain, x, y, steps), step_time(fused, x, y, steps)
    found = {"forward_relative_error": forward, "worst_gradient": worst, "gradient_relative_error": errors[worst],
             "plain_step_s": plain_s, "fused_step_s": fused_s, "batch": batch,
             "forward_tolerance": FUSED_FORWARD_TOLERANCE, "backward_tolerance": FUSED_BACKWARD_TOLERANCE}
    ok = forward <= FUSED_FORWARD_TOLERANCE and errors[worst] <= FUSED_BACKWARD_TOLERANCE
    return ("pass" if ok else "fail"), (
        f"{dtype} {layout} ResNet-{depth}, fused vs plain BatchNorm ops, same weights: logits {forward:.1e} "
        f"(tolerance {FUSED_FORWARD_TOLERANCE:g}), worst gradient {errors[worst]:.1e} ({worst}; tolerance "
        f"{FUSED_BACKWARD_TOLERANCE:g}); forward+backward at batch {batch}: plain {plain_s * 1000:.0f} ms, fused "
        f"{fused_s * 1000:.0f} ms"), found


def check_fused_batchnorm(machine, args):
    """NVIDIA's fused BatchNorm+ReLU and BatchNorm+add+ReLU (its MXNet builds only), which float16 runs on GPUs use
    there by default, against the plain ops: float16 NHWC 4-channel ResNet-50 on gpu(0)."""
    import mxnet as mx
    if not devices.nvidia_fused_batchnorm():
        return NOT_APPLICABLE, ("this MXNet has no fused BatchNorm ops for GPUs (upstream's build): float16 runs "
                                "use the plain ones"), {}
    return compare_fused(machine, mx.gpu(0), "float16", "NHWC", 4, depth=50, size=224, batch=64)
