"""Run by tests/e2e/test_horovod_training.py under a launcher with 2 ranks: each rank fills arrays of every dtype
the kit sends (special floats too) and two ResNet-18s (on one context, and on two without cpu(0)) with its own
values, then Distributed.broadcast_ and broadcast_parameters; saves what each rank had before
(<out>/before-rank<r>.npz) and after (after-rank<r>.npz)."""
import os
import sys

import numpy as np

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.dirname(TESTS), TESTS]  # the kit's modules, and tests/support
import horovod.mxnet as hvd  # noqa: E402
import mxnet as mx  # noqa: E402

import models  # noqa: E402
from rn50kit.training import distributed  # noqa: E402

SPECIAL = [-0.0, 0.0, np.nan, np.inf, -np.inf, 1e-40, -3.5]  # 1e-40: a float32 subnormal


def own_arrays(rank):
    """This rank's own values: random, plus the special floats on rank 0 only."""
    rng = np.random.RandomState(rank)
    arrays = {"float64": rng.randn(5), "int32": rng.randint(-9, 9, 6), "uint8": rng.randint(0, 255, 300),
              "int8": rng.randint(-128, 127, 40), "int64": rng.randint(-9, 9, 3), "float16": rng.randn(37),
              "float32": rng.randn(20)}  # 37 float16: Horovod sums 8 at a time with F16C, the rest one by one
    arrays = {dtype: values.astype(dtype) for dtype, values in arrays.items()}
    if rank == 0:
        arrays["float32"][:len(SPECIAL)] = SPECIAL
        arrays["float16"][:3] = [-0.0, np.nan, np.inf]
        arrays["float16"][33:36] = [-0.0, np.inf, 6e-8]  # in the scalar tail too; 6e-8: a float16 subnormal
    return arrays


def main():
    out = sys.argv[1]
    hvd.init()
    dist = distributed.Distributed(hvd)
    rng = np.random.RandomState(10 + dist.rank)
    # One context, and two without cpu(0) as a worker's GPUs would be; no forward pass (oneDNN's reordered
    # weights could not be sent by any Horovod collective).
    nets = {"param": mx.cpu(), "two_contexts": [mx.cpu(1), mx.cpu(2)]}
    for prefix, ctx in nets.items():
        nets[prefix] = net = models.get_model("resnet18_v1.5", num_classes=10)
        net.initialize(mx.init.Xavier(), ctx=ctx)
        for param in net.collect_params().values():  # BatchNorm's ones and zeros too: every rank's own values
            param.set_data(mx.nd.array(rng.randn(*param.shape)))
    arrays = own_arrays(dist.rank)
    before = dict(arrays)
    for prefix, net in nets.items():
        before.update({f"{prefix}.{k}": p.list_data()[0].asnumpy() for k, p in net.collect_params().items()})
    np.savez(os.path.join(out, f"before-rank{dist.rank}.npz"), **before)
    nd_arrays = {dtype: mx.nd.array(values, dtype=dtype) for dtype, values in arrays.items()}
    dist.broadcast_(list(nd_arrays.values()), "test")
    after = {k: v.asnumpy() for k, v in nd_arrays.items()}
    for prefix, net in nets.items():
        dist.broadcast_parameters(net)
        # the last copy: on two contexts, the one broadcast_parameters copies rank 0's values into
        after.update({f"{prefix}.{k}": p.list_data()[-1].asnumpy() for k, p in net.collect_params().items()})
    np.savez(os.path.join(out, f"after-rank{dist.rank}.npz"), **after)
    dist.finish()


if __name__ == "__main__":
    main()
