"""Training: the kit's own step on synthetic data, float32 on the CPU and float16 with dynamic loss scaling on the
GPU: the loss falls (and the scale settles)."""

def train_steps(ctx, dtype, layout, channels, size, layers, steps, batch, lr):
    """The kit's own step (fit.train_step, its trainer and loss scaler) on the synthetic backend's learnable
    data: (losses, applied flags, final loss scale)."""
    import mxnet as mx
    from mxnet import gluon

    import fit
    import models
    from rn50kit.data import backend_synthetic
    from rn50kit.training import optimizers
    from rn50kit.training.distributed import Distributed
    net = models.get_model(f"resnet{layers}_v1.5", num_classes=10, layout=layout, input_layout=layout,
                           in_channels=channels, dtype=dtype)
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net.hybridize(static_alloc=True, static_shape=True)
    iterator = backend_synthetic.SyntheticIterator(batch, (channels, size, size), 10, steps, ctx, dtype=dtype,
                                                   layout=layout)
    trainer = optimizers.make_trainer(net, Distributed(None), None, "sgd", 5e-5, 0.9)
    trainer.set_learning_rate(lr)
    scaler = fit.make_loss_scaler(None, dtype)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    losses, applied = [], []
    for batch_data in iterator:
        loss, _, finite = fit.train_step(net, trainer, scaler, loss_fn, batch_data.data, batch_data.label, batch,
                                         scan_grads=dtype == "float16")
        losses.append(loss)
        applied.append(bool(finite))
    return losses, applied, scaler.scale


def falling(losses, window=5):
    import math
    finite = [x for x in losses if math.isfinite(x)]
    return len(finite) >= 2 * window and sum(finite[-window:]) / window < sum(finite[:window]) / window


def check_training_cpu(machine, args):
    import mxnet as mx
    losses, applied, _ = train_steps(mx.cpu(), "float32", "NCHW", 3, 32, 18, args.steps, 16, 0.1)
    found = {"losses": losses}
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    detail = f"{len(losses)} float32 ResNet-18 steps on synthetic data: loss {first:.3f} -> {last:.3f} (means of 5)"
    return ("pass" if falling(losses) and all(applied) else "fail"), detail, found


def check_training_gpu(machine, args):
    import mxnet as mx
    losses, applied, scale = train_steps(mx.gpu(0), "float16", "NHWC", 4, 224, 50, args.steps, 64, 0.1)
    overflows = applied.count(False)
    late = applied[len(applied) // 2:].count(False)
    found = {"losses": losses, "applied": applied, "final_scale": scale}
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    detail = (f"{len(losses)} float16 NHWC ResNet-50 steps (batch 64, dynamic loss scaling): loss {first:.3f} -> "
              f"{last:.3f}, {overflows} skipped for overflow ({late} in the second half), scale {scale:g}")
    ok = falling(losses) and late == 0 and overflows <= len(applied) // 4
    return ("pass" if ok else "fail"), detail, found
