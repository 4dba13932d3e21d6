"""Run by tests/e2e/test_horovod_training.py under horovodrun with 2 ranks: a network with float16 and float32
(BatchNorm) parameters gets rank-dependent gradients, allreduced by Horovod's DistributedTrainer and by an elastic
run's (optimizers.one_dtype_at_a_time), with and without --fp16-allreduce; writes <out>/rank<r>.npz: each
trainer's gradients after allreduce_grads (<kind>.<parameter>), the gradients given (given.<parameter>) and each
trainer's scale (<kind>.scale)."""
import os
import sys

import numpy as np

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.dirname(TESTS), TESTS]  # the kit's modules, and tests/support
import horovod.mxnet as hvd  # noqa: E402
import mxnet as mx  # noqa: E402
from mxnet import gluon  # noqa: E402

from rn50kit.training import distributed, optimizers  # noqa: E402


def main():
    out = sys.argv[1]
    hvd.init()
    dist = distributed.Distributed(hvd)
    net = gluon.nn.HybridSequential(prefix="net_")
    with net.name_scope():
        net.add(gluon.nn.Dense(8, in_units=4), gluon.nn.BatchNorm(in_channels=8), gluon.nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier())
    net.cast("float16")  # BatchNorm's parameters stay float32
    params = {name: p for name, p in net.collect_params().items() if p.grad_req != "null"}
    rng = np.random.RandomState(dist.rank)
    given = {name: rng.uniform(-2, 2, p.shape).astype(p.dtype) for name, p in params.items()}
    saved = {f"given.{name}": value for name, value in given.items()}
    for kind, elastic, fp16_allreduce in (("horovod", False, False), ("elastic", True, False),
                                          ("horovod_fp16", False, True), ("elastic_fp16", True, True)):
        dist.elastic = elastic
        trainer = optimizers.make_trainer(net, dist, "horovod", "sgd", 0.0, 0.9, fp16_allreduce, 1)
        for name, param in params.items():
            param.grad()[:] = given[name]
        trainer.allreduce_grads()
        saved.update({f"{kind}.{name}": param.grad().asnumpy() for name, param in params.items()})
        saved[f"{kind}.scale"] = np.array(trainer._scale)
    np.savez(os.path.join(out, f"rank{dist.rank}.npz"), **saved)
    hvd.shutdown()


if __name__ == "__main__":
    main()
