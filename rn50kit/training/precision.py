"""Mixed precision: loss scaling, the finite checks that decide whether a step's update is applied, and the
guard that keeps a bad step's forward pass out of the BatchNorm statistics."""
import mxnet as mx
import numpy as np

from models import running_stats


class LossScaler:
    """Loss scaling: multiply the loss before backward, divide the gradients in the update.

    Dynamic (the default for float16, as MXNet AMP): on a non-finite gradient the step is skipped and the
    scale halved; after ``growth_interval`` clean steps it doubles. Static scales only skip bad steps.
    """

    def __init__(self, scale=1.0, dynamic=False, growth_interval=2000, factor=2.0, min_scale=2.0 ** -14):
        self.scale = float(scale)
        self.dynamic = dynamic
        self.growth_interval = growth_interval
        self.factor = factor
        self.min_scale = min_scale
        self.clean_steps = 0
        self.bad_steps = 0  # consecutive

    def update(self, finite):
        if finite:
            self.bad_steps = 0
            self.clean_steps += 1
            if self.dynamic and self.clean_steps >= self.growth_interval:
                self.scale *= self.factor
                self.clean_steps = 0
        else:
            self.bad_steps += 1
            self.clean_steps = 0
            if self.dynamic:
                self.scale = max(self.scale / self.factor, self.min_scale)

    def state(self):
        return {"scale": self.scale, "clean_steps": self.clean_steps, "bad_steps": self.bad_steps}

    def load(self, state):
        self.scale, self.clean_steps, self.bad_steps = state["scale"], state["clean_steps"], state["bad_steps"]


def make_loss_scaler(loss_scale, dtype):
    """--loss-scale: 'dynamic' (the default for float16), a fixed number, or None (1 for other dtypes)."""
    if loss_scale == "dynamic" or (loss_scale is None and dtype == "float16"):
        return LossScaler(2.0 ** 16, dynamic=True)
    return LossScaler(float(loss_scale or 1.0))


def grads_finite(params):
    return all_finite([g for p in params if p.grad_req != "null" for g in p.list_grad()])


class StatsGuard:
    """A copy of the BatchNorm running statistics from before the step: a forward pass over a NaN/inf batch
    would otherwise poison them even though the weight update is skipped (small: 2 vectors per BN layer)."""

    def __init__(self, net, fused=None):
        """``fused``: keep the float32 statistics of a device with one amp_multicast (None: on GPUs only)."""
        self.stats = [a for p in running_stats(net) for a in p.list_data()]
        self.backup = [a.copy() for a in self.stats]
        groups = {}
        for src, dst in zip(self.stats, self.backup):
            groups.setdefault((src.context, np.dtype(src.dtype)), []).append((src, dst))
        self.groups = list(groups.items())
        self.fused = fused

    def keep(self):
        """Copy every statistic into its backup. On a GPU one amp_multicast per device for the float32 ones (a
        float32 to float32 cast is a copy; ResNet-50 has 106 statistics per device, each a kernel launch as a
        copy). On a CPU one copy each: oneDNN's amp_multicast runs a reorder per array, each its own parallel
        region, 4-5x slower than the copies with 2 threads (tools/bench_step_parts.py); nor does it take float16."""
        for (ctx, dtype), pairs in self.groups:
            fused = ctx.device_type == "gpu" if self.fused is None else self.fused
            if fused and dtype == np.float32:
                mx.nd.amp_multicast(*[src for src, _ in pairs], num_outputs=len(pairs), out=[dst for _, dst in pairs])
            else:
                for src, dst in pairs:
                    src.copyto(dst)

    def restore_if_bad(self):
        if self.stats and not all_finite(self.stats):
            for src, dst in zip(self.backup, self.stats):
                src.copyto(dst)


# mx.nd.multi_all_finite takes its element type from its first input (another dtype fails: "data type do not
# match") and has room for 200 inputs with no bounds check (MXNet 1.9.1, src/operator/contrib/all_finite.cc/.cu:
# MSHADOW_REAL_TYPE_SWITCH(inputs[0].type_flag_); all_finite-inl.h: MultiAllFiniteKernelParam::N = 200); one
# kernel runs on one device. A float16 network has float16 and float32 (BatchNorm) gradients, ResNet-101 and
# deeper over 300 of them, --kv-store device a set on every GPU. MXNet's AMP (contrib/amp/loss_scaler.py) also
# checks in chunks of 200.
MULTI_ALL_FINITE_MAX_ARRAYS = 200


def finite_check_groups(arrays, size=MULTI_ALL_FINITE_MAX_ARRAYS):
    """``arrays`` as multi_all_finite accepts them: groups of one device and one dtype, at most ``size`` each."""
    groups = {}
    for array in arrays:
        groups.setdefault((array.context, np.dtype(array.dtype)), []).append(array)
    return [group[i:i + size] for group in groups.values() for i in range(0, len(group), size)]


def all_finite(arrays):
    """Whether every value of ``arrays`` is finite; they may mix dtypes and devices."""
    flags = [mx.nd.multi_all_finite(*group, num_arrays=len(group), init_output=True)
             for group in finite_check_groups(arrays)]
    return all(bool(flag.asscalar()) for flag in flags)  # all queued first: the device is waited for once
