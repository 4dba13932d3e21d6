"""The few collectives the loop and scoring need, over Horovod's ranks (one process works too), and the
averaging of what each device keeps for itself."""
import json

import mxnet as mx
import numpy as np
from mxnet import gluon

from rn50kit.weights import checkpoint


class Distributed:
    """Rank information and the few collectives the loop needs (Horovod; one process works too)."""

    def __init__(self, hvd):
        self.hvd = hvd
        self.elastic = False  # an elastic run (worker.start_worker): no collective before its first sync
        self.refresh()

    def refresh(self):
        """Read this process's place again (an elastic run's world changed)."""
        if self.hvd is None:  # device/local kv-store: one process
            self.rank, self.size, self.local_rank, self.local_size = 0, 1, 0, 1
        else:
            self.rank, self.size = self.hvd.rank(), self.hvd.size()
            self.local_rank, self.local_size = self.hvd.local_rank(), self.hvd.local_size()

    @property
    def is_primary(self):
        return self.rank == 0

    def sum(self, values, name):
        """Sum a list of floats over all ranks."""
        if self.hvd is None or self.size == 1:
            return [float(v) for v in values]
        array = mx.nd.array(values, dtype="float64")
        return self.hvd.allreduce(array, op=self.hvd.Sum, name=name).asnumpy().tolist()

    def gather(self, values, name):
        """Every rank's list of floats, indexed by rank (exact: each rank adds zeros to the others' slots)."""
        if self.hvd is None or self.size == 1:
            return [[float(v) for v in values]]
        slots = np.zeros((self.size, len(values)))
        slots[self.rank] = values
        return np.array(self.sum(slots.ravel().tolist(), name)).reshape(self.size, len(values)).tolist()

    def gather_json(self, value, name):
        """Every rank's ``value`` (plain values: JSON), indexed by rank: each rank's bytes in its own part of a
        buffer summed over the ranks (the others give zeros there), so no pickle crosses."""
        data = np.frombuffer(json.dumps(value).encode(), np.uint8)
        if self.hvd is None or self.size == 1:
            return [json.loads(data.tobytes())]
        lengths = [int(length) for length, in self.gather([len(data)], f"{name}.lengths")]
        start = sum(lengths[:self.rank])
        buffer = np.zeros(sum(lengths), np.uint8)
        buffer[start:start + len(data)] = data
        summed = mx.nd.array(buffer, dtype="uint8")
        self.one_at_a_time([summed], name, op=self.hvd.Sum)
        raw, ends = summed.asnumpy().tobytes(), np.cumsum(lengths).tolist()
        return [json.loads(raw[end - length:end]) for length, end in zip(lengths, ends)]

    def average_(self, arrays, name):
        """Average parameters (or NDArrays) in place over all ranks (BatchNorm running statistics)."""
        if self.hvd is None or self.size == 1:
            return
        self.one_at_a_time([a.data() if isinstance(a, gluon.Parameter) else a for a in arrays], name,
                           op=self.hvd.Average)

    def one_at_a_time(self, arrays, name, **options):
        """Allreduce ``arrays`` in place (``options``: grouped_allreduce_'s op or average, scale factors...): one
        grouped collective per dtype, each waited for before the next. When a peer is lost, every collective in
        flight fails at once, and MXNet 1.9.1's engine records each failure in one unlocked list from several
        threads (ThreadedEngine::AddToGlobalExceptions): entries race, the list is corrupted and the next waitall
        segfaults (docs/design.md). One in flight at a time; it returns with all of them done."""
        by_dtype = {}
        for array in arrays:
            by_dtype.setdefault(np.dtype(array.dtype).name, []).append(array)
        for dtype, group in by_dtype.items():
            self.hvd.grouped_allreduce_(group, name=f"{name}.{dtype}", **options)
            for array in group:
                array.wait_to_read()

    def finish(self):
        """Before a worker exits: its queued collectives done, and every rank at this point (so no rank's
        exit shuts Horovod down under another's last allreduce or rank 0's last checkpoint)."""
        mx.nd.waitall()
        self.sum([0.0], "finish")

    def shutdown(self):
        """Horovod shut down on every rank in step: one rank's request ends every rank's background loop at their
        next cycle (Horovod 0.28.1, Controller::ComputeResponseList), so no rank sees a peer vanish mid-cycle."""
        if self.hvd is not None:
            self.hvd.shutdown()

    def broadcast_(self, arrays, name):
        """Rank 0's values of ``arrays`` (NDArrays, changed in place) on every rank, bit for bit (a NaN stays a
        NaN, its bits may not): an allreduce to which the other ranks give -0.0 (x + -0.0 is x, a zero's sign
        included), not Horovod's broadcast. Horovod 0.28.1's EnqueueTensorBroadcast logs the tensor's name after
        queueing it; when its background thread has finished the broadcast by then, MXNet has freed the name and
        the worker dies of a segfault (docs/design.md)."""
        if self.hvd is None or self.size == 1:
            return
        if self.rank != 0:
            for array in arrays:
                array[:] = 0
                mx.nd.negative(array, out=array)  # -0.0 (assigning -0.0 stores +0.0)
        self.one_at_a_time(arrays, name, op=self.hvd.Sum)

    def broadcast_parameters(self, net):
        """Rank 0's weights on every rank and every context of it (rank 0's first copy of each parameter); the
        parameters must be initialized (train.py ends deferred ones first)."""
        if self.hvd is None or self.size == 1:
            return
        named = net.collect_params()
        params = [named[key] for key in sorted(named.keys())]
        self.broadcast_([param.list_data()[0] for param in params], "parameters")
        for param in params:
            first, *others = param.list_data()
            for copy in others:
                first.copyto(copy)


def average_over_devices(params):
    """Give parameters kept on several devices (BatchNorm statistics, which each device updates from its own
    slice of the batch) their mean on every device, so validation and checkpoints do not depend on the device."""
    for param in params:
        copies = param.list_data()
        if len(copies) > 1:
            param.set_data(mx.nd.add_n(*[c.as_in_context(copies[0].context) for c in copies]) / len(copies))


def chosen_by_rank_0(choose, dist, warn=None):
    """``choose(warn)``'s checkpoint state (or None) on every rank, its files read once: rank 0 chooses (verifying
    each file's SHA-256; ``warn`` hears of the damaged ones) and tells the others which, or the one-line error;
    they read that state file, checking only sizes (every rank hashing every file was 64 reads of the checkpoint
    with 64 ranks). Alone, or in an elastic run (no collective before its first sync, which sends rank 0's
    state), each rank chooses for itself."""
    if dist.size == 1 or dist.elastic:
        return choose(warn if dist.is_primary else None)
    if dist.is_primary:
        try:
            state = choose(warn)
        except Exception as error:
            dist.gather_json({"error": str(error)}, "resume.choice")
            raise
        dist.gather_json({"path": state and state["state_path"]}, "resume.choice")
        return state
    told = dist.gather_json(None, "resume.choice")[0]
    if "error" in told:
        raise checkpoint.CheckpointError(told["error"])
    if told["path"] is None:
        return None
    state, why = checkpoint.inspect(told["path"])
    if state is None:
        raise checkpoint.CheckpointError(f"rank {dist.rank}: {why}")
    return state
