"""Numerics: the float32 ResNet-50 against a float64 reference on the CPU, and float16 NHWC on the GPU against
float32 on the CPU, with the same weights; the helpers the other numeric checks share."""
import os

FORWARD_TOLERANCE = 2e-2  # float16 NHWC logits vs float32 NCHW: relative L2 error


BACKWARD_TOLERANCE = 5e-2  # the classifier's weight gradient: relative L2 error


def resnet(layout="NCHW", channels=3, dtype="float32", ctx=None, classes=1000):
    import mxnet as mx

    import models
    net = models.get_model("resnet50_v1.5", num_classes=classes, layout=layout, input_layout=layout,
                           in_channels=channels, dtype=dtype)
    net.initialize(mx.init.Xavier(), ctx=ctx or mx.cpu())
    return net


def fixed_batch(batch=4, size=224, seed=0):
    import numpy as np
    rng = np.random.RandomState(seed)
    return rng.uniform(-2, 2, (batch, 3, size, size)).astype("float32"), rng.randint(0, 1000, batch)


def as_input(images, layout, channels):
    import numpy as np
    if channels == 4:
        images = np.concatenate([images, np.zeros_like(images[:, :1])], axis=1)
    return images.transpose(0, 2, 3, 1) if layout == "NHWC" else images


def forward_backward(net, images, labels, ctx, dtype):
    """(logits, gradient of the classifier's weight) of one training-mode forward and backward."""
    import mxnet as mx
    from mxnet import autograd, gluon
    x = mx.nd.array(images, ctx=ctx, dtype=dtype)
    y = mx.nd.array(labels, ctx=ctx)
    with autograd.record():
        logits = net(x).astype("float32")
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(logits, y)
    loss.backward()
    fc = [p for p in net.collect_params().values() if len(p.shape) == 2][-1]  # the classifier's weight
    return logits.asnumpy(), fc.grad(ctx).astype("float32").asnumpy()


def relative_error(a, b):
    import numpy as np
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def check_numerics_cpu(machine, args):
    """The float32 NCHW ResNet-50 (oneDNN) against a float64 reference with the same weights (MXNet's own
    non-oneDNN kernels), and against the same weights in the 4-channel structure (the conversion the GPU
    comparison relies on: load_parameters pads the stem): forward and one backward, on the CPU."""
    import mxnet as mx

    from rn50kit.graph.parameters import load_parameters
    images, labels = fixed_batch(batch=2)
    net = resnet()
    net.infer_shape(mx.nd.zeros((1, 3, 224, 224)))
    path = os.path.join(machine.workdir, "reference.params")
    net.save_parameters(path)
    net.hybridize()
    logits, grad = forward_backward(net, images, labels, mx.cpu(), "float32")
    reference = resnet()
    reference.infer_shape(mx.nd.zeros((1, 3, 224, 224)))
    load_parameters(reference, path, mx.cpu())
    reference.cast("float64")
    ref_logits, ref_grad = forward_backward(reference, images, labels, mx.cpu(), "float64")
    padded = resnet(channels=4)
    padded.infer_shape(mx.nd.zeros((1, 4, 224, 224)))
    load_parameters(padded, path, mx.cpu())
    logits4, grad4 = forward_backward(padded, as_input(images, "NCHW", 4), labels, mx.cpu(), "float32")
    errors = {"float64_forward": relative_error(logits, ref_logits), "float64_backward": relative_error(grad, ref_grad),
              "4_channel_forward": relative_error(logits4, logits), "4_channel_backward": relative_error(grad4, grad)}
    tolerance = 1e-4
    ok = max(errors.values()) <= tolerance
    return ("pass" if ok else "fail"), (
        f"float32 ResNet-50 vs float64 reference: logits {errors['float64_forward']:.1e}, classifier gradient "
        f"{errors['float64_backward']:.1e}; 4-channel structure, same weights: {errors['4_channel_forward']:.1e}, "
        f"{errors['4_channel_backward']:.1e} (relative L2, tolerance {tolerance:g})"), dict(errors, tolerance=tolerance)


def check_numerics_gpu(machine, args):
    """float16 NHWC 4-channel ResNet-50 on gpu(0) against the float32 NCHW network with the same weights on the
    CPU: one training-mode forward and backward on a fixed batch."""
    import mxnet as mx

    from rn50kit.graph.parameters import load_parameters
    images, labels = fixed_batch(batch=8)
    reference = resnet()
    reference.infer_shape(mx.nd.zeros((1, 3, 224, 224)))
    path = os.path.join(machine.workdir, "reference.params")
    reference.save_parameters(path)
    ref_logits, ref_grad = forward_backward(reference, images, labels, mx.cpu(), "float32")
    net = resnet(layout="NHWC", channels=4, dtype="float16", ctx=mx.gpu(0))
    net.infer_shape(mx.nd.zeros((1, 224, 224, 4), ctx=mx.gpu(0), dtype="float16"))
    load_parameters(net, path, mx.gpu(0))
    net.hybridize(static_alloc=True, static_shape=True)
    logits, grad = forward_backward(net, as_input(images, "NHWC", 4), labels, mx.gpu(0), "float16")
    forward, backward = relative_error(logits, ref_logits), relative_error(grad, ref_grad)
    found = {"forward_relative_error": forward, "backward_relative_error": backward,
             "forward_tolerance": FORWARD_TOLERANCE, "backward_tolerance": BACKWARD_TOLERANCE}
    ok = forward <= FORWARD_TOLERANCE and backward <= BACKWARD_TOLERANCE
    return ("pass" if ok else "fail"), (f"float16 NHWC 4-channel on the GPU vs float32 NCHW on the CPU: logits "
                                        f"{forward:.1e} (tolerance {FORWARD_TOLERANCE:g}), classifier gradient "
                                        f"{backward:.1e} (tolerance {BACKWARD_TOLERANCE:g}), relative L2"), found
