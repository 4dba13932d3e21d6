"""The synthetic backend: random images made on the device, for speed tests without data, with labels a network can
learn (so validation measures learning)."""
import math

import mxnet as mx

from rn50kit.data.iterators import BatchIterator
from rn50kit.data.protocol import out_dtype


class SyntheticIterator(BatchIterator):
    """Random images made once on the device, for compute-only benchmarks, with learnable labels.

    Each label is a fixed random linear rule applied to the image (argmax over classes of ``W . features``,
    the features being the per-channel means of the four image quadrants), so a network can learn it and
    validation, on fresh images of the same distribution labelled by the same rule, measures learning.
    (The original kit validated random labels on a second random batch: chance accuracy by construction.)
    ``pool`` distinct batches are made and served in turn, to bound device memory.
    """

    def __init__(self, batch_size, image_shape, num_classes, num_batches, ctx, dtype="float32",
                 layout="NCHW", rule_seed=0, image_seed=1, pool=4):
        channels, height, width = image_shape
        mx.random.seed(rule_seed, ctx=ctx)  # the rule is shared by train and val: same seed
        rule = mx.nd.random.normal(shape=(4 * channels, num_classes), ctx=ctx)
        mx.random.seed(image_seed, ctx=ctx)
        self.batches = []
        for _ in range(min(pool, num_batches)):
            data = mx.nd.random.uniform(-1, 1, shape=(batch_size, channels, height, width), ctx=ctx)
            label = mx.nd.argmax(mx.nd.dot(quadrant_means(data), rule), axis=1)
            if layout == "NHWC":
                data = data.transpose((0, 2, 3, 1))
            self.batches.append((data.astype(dtype), label.astype("float32")))
        mx.nd.waitall()
        super().__init__(num_batches * batch_size, batch_size)

    def next_arrays(self, valid):
        return self.batches[self._served // self.batch_size % len(self.batches)]


def quadrant_means(data):
    """(N, C, H, W) -> (N, 4*C): each channel's mean over the four quadrants, standardised so the rule's
    classes are balanced whatever the image size (the raw means shrink as 1/sqrt(H*W))."""
    pooled = mx.nd.contrib.AdaptiveAvgPooling2D(data, output_size=2).reshape((data.shape[0], -1))
    return pooled * math.sqrt(data.shape[2] * data.shape[3] / 4 * 3)  # uniform(-1,1) variance is 1/3


def get_iterators(cfg, feed, rank, num_workers, local_rank, local_size, ctx):
    """The synthetic backend's builder (protocol.GetIterators): 32 global batches an epoch unless --num-examples."""
    local_batch = feed.batch_size // num_workers
    steps = math.ceil((cfg.num_examples or 32 * feed.batch_size) / feed.batch_size)
    seed = 0 if feed.seed is None else feed.seed
    common = dict(batch_size=local_batch, image_shape=cfg.image_shape, num_classes=feed.num_classes, ctx=ctx,
                  dtype=out_dtype(feed.dtype), layout=cfg.input_layout, rule_seed=seed)
    train = SyntheticIterator(num_batches=steps, image_seed=seed * 1000 + 2 * rank + 1, **common)
    val = SyntheticIterator(num_batches=max(1, steps // 4), image_seed=seed * 1000 + 2 * rank + 2, **common)
    return train, val
