"""The training targets and their loss: smoothed one-hot labels, mixup and CutMix (the batch mixed with its
reverse), softmax or binary cross-entropy on the soft targets."""
import math

import mxnet as mx
import numpy as np
from mxnet import gluon


def make_targets(label, num_classes, smoothing, mix, epoch_rng, data, cutmix=0.0, switch_prob=0.5):
    """Smoothed one-hot targets; with mixup, data and targets mixed with the reversed batch; with CutMix (alone,
    or instead of mixup with probability ``switch_prob``), a box of the reversed batch pasted in."""
    target = label.one_hot(num_classes, on_value=1 - smoothing + smoothing / num_classes,
                           off_value=smoothing / num_classes)
    if cutmix and (not mix or epoch_rng.rand() < switch_prob):
        return cutmix_batch(data, target, cutmix, epoch_rng)
    if mix:
        coeffs = epoch_rng.beta(mix, mix, size=data.shape[0]).astype("float32")
        c = mx.nd.array(coeffs, ctx=data.context)
        shape = (-1,) + (1,) * (data.ndim - 1)
        data = (c.reshape(shape) * data.astype("float32") + (1 - c.reshape(shape)) *
                data[::-1].astype("float32")).astype(data.dtype)
        target = c.reshape((-1, 1)) * target + (1 - c.reshape((-1, 1))) * target[::-1]
    return data, target


def cutmix_batch(data, target, alpha, rng):
    """timm's CutMix ("batch" mode): one box of area about (1 - lam) of the image, lam ~ Beta(alpha, alpha), centred
    uniformly and clipped to the image, pasted from the reversed batch into every image; the targets are mixed by
    the area actually pasted. NCHW or NHWC (the channel axis is the one of size 3 or 4)."""
    nhwc = data.shape[3] in (3, 4) and data.shape[1] not in (3, 4)
    height, width = data.shape[1:3] if nhwc else data.shape[2:4]
    lam = rng.beta(alpha, alpha)
    cut = math.sqrt(1 - lam)
    cut_h, cut_w = int(height * cut), int(width * cut)
    cy, cx = rng.randint(0, height), rng.randint(0, width)
    y0, y1 = np.clip([cy - cut_h // 2, cy + cut_h // 2], 0, height)
    x0, x1 = np.clip([cx - cut_w // 2, cx + cut_w // 2], 0, width)
    box = np.zeros((height, width), dtype="float32")
    box[y0:y1, x0:x1] = 1
    pasted = float(box.mean())  # the share of the image from the reversed batch
    mask = mx.nd.array(box.reshape((1, height, width, 1) if nhwc else (1, 1, height, width)), ctx=data.context,
                       dtype=data.dtype)
    data = mx.nd.broadcast_mul(data, 1 - mask) + mx.nd.broadcast_mul(data[::-1], mask)
    return data, (1 - pasted) * target + pasted * target[::-1]


class BinaryCrossEntropy(gluon.loss.Loss):
    """Binary cross-entropy of every class's logit against its (soft) target, averaged over the classes: timm's
    BinaryCrossEntropy (mean over batch and classes), with its target threshold (``thresh``; 0: soft targets)."""

    def __init__(self, thresh=0.0, **kwargs):
        super().__init__(weight=None, batch_axis=0, **kwargs)
        self.thresh = thresh

    def hybrid_forward(self, F, pred, target):
        if self.thresh:
            target = target > self.thresh
        # max(x, 0) - x t + log(1 + exp(-|x|)): stable for any logit
        loss = F.relu(pred) - pred * target + F.Activation(-F.abs(pred), act_type="softrelu")
        return F.mean(loss, axis=1)


def make_loss(cfg):
    """The training loss of a FitConfig (on soft targets: smoothing, mixup, CutMix)."""
    if cfg.loss == "bce":
        return BinaryCrossEntropy(cfg.bce_target_thresh)
    return gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)


def mean_loss(losses):
    """The mean of the per-device loss vectors, read from the devices at once."""
    sums = [loss.sum().as_in_context(mx.cpu()) for loss in losses]
    total = sums[0] if len(sums) == 1 else mx.nd.add_n(*sums)
    return total.asscalar() / sum(loss.shape[0] for loss in losses)
