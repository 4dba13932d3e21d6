"""Run by tests/e2e/test_horovod_training.py under a launcher with 2 ranks: each rank fills arrays of every dtype
the kit sends (special floats too) and a ResNet-18 with its own values, then Distributed.broadcast_ and
broadcast_parameters; saves what each rank had before (<out>/before-rank<r>.npz) and after (after-rank<r>.npz)."""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import horovod.mxnet as hvd  # noqa: E402
import mxnet as mx  # noqa: E402

import models  # noqa: E402
from rn50kit.training import distributed  # noqa: E402

SPECIAL = [-0.0, 0.0, np.nan, np.inf, -np.inf, 1e-40, -3.5]  # 1e-40: a float32 subnormal


def own_arrays(rank):
    """This rank's own values: random, plus the special floats on rank 0 only."""
    rng = np.random.RandomState(rank)
    arrays = {"float64": rng.randn(5), "int32": rng.randint(-9, 9, 6), "uint8": rng.randint(0, 255, 300),
              "int64": rng.randint(-9, 9, 3), "float16": rng.randn(7), "float32": rng.randn(20)}
    arrays = {dtype: values.astype(dtype) for dtype, values in arrays.items()}
    if rank == 0:
        arrays["float32"][:len(SPECIAL)] = SPECIAL
        arrays["float16"][:3] = [-0.0, np.nan, np.inf]
    return arrays


def main():
    out = sys.argv[1]
    hvd.init()
    dist = distributed.Distributed(hvd)
    net = models.get_model("resnet18_v1.5", num_classes=10)
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())  # no forward pass: oneDNN's reordered weights would not go
    params = net.collect_params()
    rng = np.random.RandomState(10 + dist.rank)
    for param in params.values():  # BatchNorm's ones and zeros too: every rank's own values
        param.set_data(mx.nd.array(rng.randn(*param.shape)))
    arrays = own_arrays(dist.rank)
    before = {**arrays, **{f"param.{k}": p.data().asnumpy() for k, p in params.items()}}
    np.savez(os.path.join(out, f"before-rank{dist.rank}.npz"), **before)
    nd_arrays = {dtype: mx.nd.array(values, dtype=dtype) for dtype, values in arrays.items()}
    dist.broadcast_(list(nd_arrays.values()), "test")
    dist.broadcast_parameters(net)
    after = {**{k: v.asnumpy() for k, v in nd_arrays.items()},
             **{f"param.{k}": p.data().asnumpy() for k, p in params.items()}}
    np.savez(os.path.join(out, f"after-rank{dist.rank}.npz"), **after)
    dist.finish()


if __name__ == "__main__":
    main()
