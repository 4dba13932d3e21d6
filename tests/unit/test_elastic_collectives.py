"""An elastic run keeps one collective in flight at a time: a lost peer fails every collective in flight at once,
and MXNet 1.9.1's engine records the failures in one unlocked list from several threads (docs/design.md).

The step runs with the kit's own trainer (Horovod's DistributedTrainer, in a world of 2 as Horovod's process set
reports it) and its vote; Horovod's collectives are recorded as they are enqueued, each with the collectives
enqueued before it and not yet waited for (wait_to_read, asnumpy, waitall). They compute what two identical ranks
would (a sum doubles), on MXNet's engine. float16 does not compute convolutions on CPU: the float16 network's
step starts after its backward pass (fit.apply_step), with the gradients it would have. The real collectives of
elastic runs run in tests/e2e/test_elastic_training.py.
"""
import collections

import mxnet as mx
import numpy as np
import pytest

import fit
import models
from rn50kit.config import fit_flags
from rn50kit.training import optimizers
from rn50kit.training.distributed import Distributed
from rn50kit.training.precision import make_loss_scaler
from rn50kit.training.stop_signals import StopFlag


class Collectives:
    """Horovod's allreduces over 2 identical ranks, recorded: (name, dtypes, arrays, names still in flight)."""

    def __init__(self, monkeypatch, hvd):
        self.hvd = hvd
        self.enqueued = []
        self.pending = []  # [name, handles of its outputs not waited for yet]
        for name, value in (("rank", 0), ("local_rank", 0), ("size", 2), ("local_size", 2)):
            monkeypatch.setattr(hvd, name, lambda value=value: value)
        process_set = type(hvd.global_process_set)
        monkeypatch.setattr(process_set, "size", lambda _self: 2)
        monkeypatch.setattr(process_set, "included", lambda _self: True)
        monkeypatch.setattr(hvd, "grouped_allreduce_", self.grouped_allreduce_)
        monkeypatch.setattr(hvd, "allreduce_", lambda tensor, **kwargs: self.grouped_allreduce_([tensor], **kwargs))
        monkeypatch.setattr(hvd, "allreduce", self.allreduce)
        real = mx.nd.NDArray.wait_to_read, mx.nd.NDArray.asnumpy, mx.nd.waitall
        monkeypatch.setattr(mx.nd.NDArray, "wait_to_read", lambda array: self.waited([array], real[0](array)))
        monkeypatch.setattr(mx.nd.NDArray, "asnumpy", lambda array: self.waited([array], real[1](array)))
        monkeypatch.setattr(mx.nd, "waitall", lambda: self.waited(None, real[2]()))

    def waited(self, arrays, result):
        """``arrays`` (None: all) waited for: collectives whose outputs all were are no longer in flight."""
        for entry in self.pending:
            entry[1] = set() if arrays is None else entry[1] - {array.handle.value for array in arrays}
        self.pending = [entry for entry in self.pending if entry[1]]
        return result

    def factor(self, kwargs):
        summed = not kwargs.get("average") if kwargs.get("op") is None else kwargs["op"] == self.hvd.Sum
        return (2.0 if summed else 1.0) * kwargs.get("prescale_factor", 1.0) * kwargs.get("postscale_factor", 1.0)

    def enqueue(self, name, outputs):
        self.enqueued.append((name, sorted({np.dtype(a.dtype).name for a in outputs}), outputs,
                              [entry[0] for entry in self.pending]))
        self.pending.append([name, {array.handle.value for array in outputs}])

    def grouped_allreduce_(self, tensors, name=None, **kwargs):
        for tensor in tensors:
            tensor *= self.factor(kwargs)  # queued on the engine, as Horovod's are
        self.enqueue(name, list(tensors))
        return tensors

    def allreduce(self, tensor, name=None, **kwargs):
        result = tensor * self.factor(kwargs)
        self.enqueue(name, [result])
        return result


@pytest.fixture
def collectives(monkeypatch, keep_signal_handlers):
    hvd = pytest.importorskip("horovod.mxnet")
    return Collectives(monkeypatch, hvd)


def elastic_step(collectives, dtype):
    """One elastic step of ResNet-18 in ``dtype`` with the kit's trainer; returns the net's gradients by dtype."""
    net = models.get_model("resnet18_v1.5", num_classes=4, dtype=dtype)
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    dist = Distributed(collectives.hvd)
    dist.elastic = True
    cfg = fit_flags.FitConfig(kv_store="horovod", dtype=dtype, optimizer="sgd")
    trainer = optimizers.trainer_for(net, dist, cfg)
    scaler, vote = make_loss_scaler(cfg.loss_scale, dtype), StopFlag(dist).vote
    if dtype == "float32":
        data, target = mx.nd.random.uniform(shape=(2, 3, 32, 32)), mx.nd.one_hot(mx.nd.array([0, 3]), 4)
        _, _, applied = fit.train_step(net, trainer, scaler, fit.make_loss(cfg), [data], [target], 2, vote=vote,
                                       scan_grads=False)
    else:  # after the backward pass: the gradients a float16 step has (the losses are float32, as train_step's)
        for param in net.collect_params().values():
            if param.grad_req != "null":
                param.grad()[:] = 0.5
                param.data()._fresh_grad = True  # as backward marks it
        _, applied = fit.apply_step(trainer, scaler, [mx.nd.array([1.5, 2.5])], 2, vote=vote, scan_grads=True)
    assert applied
    grads = collections.defaultdict(set)
    for param in net.collect_params().values():
        if param.grad_req != "null":
            grads[np.dtype(param.dtype).name].add(param.grad().handle.value)
    return grads


@pytest.mark.parametrize("dtype, dtypes", [("float32", ["float32"]), ("float16", ["float16", "float32"])])
def test_an_elastic_step_has_one_collective_in_flight_at_a_time(collectives, dtype, dtypes):
    grads = elastic_step(collectives, dtype)
    assert sorted(grads) == dtypes  # float16: BatchNorm's gradients stay float32
    for name, _, _, in_flight in collectives.enqueued:
        assert in_flight == [], f"{name} enqueued while {in_flight} were in flight"
    assert collectives.pending == [], "the step ended with collectives in flight"
    allreduced = collections.Counter(array.handle.value for name, _, arrays, _ in collectives.enqueued
                                     if name != "vote" for array in arrays)
    every_gradient = set().union(*grads.values())
    assert set(allreduced) == every_gradient and set(allreduced.values()) == {1}  # each once
    names = [name for name, *_ in collectives.enqueued]
    assert names[-1] == "vote" and names.count("vote") == 1  # after the gradients, which it waits for
    assert sorted(dtype for _, dtypes_, _, _ in collectives.enqueued[:-1] for dtype in dtypes_) == dtypes
