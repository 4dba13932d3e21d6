"""An exponential moving average of a network's weights (--ema-decay): updated after each optimizer step,
swapped in for validation and exported beside each checkpoint."""
import mxnet as mx
import numpy as np

# multi_sgd_update takes at most 60 weights per call (MXNet 1.9.1, src/operator/optimizer_op-inl.h:
# MultiSGDKernelParam::N = 60, unchecked).
MULTI_SGD_MAX_ARRAYS = 60


def first_copy(param):
    """The parameter's array on its first device. Parameter.data() without a context asks for the current
    context, cpu(0), which a network on GPUs (or on [cpu(1), cpu(2)]) does not have; with several devices the
    copies hold the same weights after each step, and BatchNorm statistics are averaged before they are used."""
    return param.list_data()[0]


class EMA:
    """Exponential moving average of every parameter (BatchNorm statistics included), kept in float32 on the
    parameter's first device."""

    def __init__(self, net, decay):
        self.decay = decay
        self.params = net.collect_params()
        self.shadow = {name: first_copy(p).astype("float32") for name, p in self.params.items()}
        self.scratch = {}  # float16 arrays multi_mp_sgd_update writes to (update)
        self.live = None  # the live weights while the averages are swapped in

    def update(self):
        """shadow <- shadow + (1 - decay) (weights - shadow), in place, in a few fused kernels instead of 5
        operators per array one by one (ResNet-50 has 267 arrays). multi_sgd_update computes
        w - lr wd w - lr rescale_grad g per element: with lr 1, wd 1 - decay, rescale_grad -(1 - decay), w the
        average and g the weights, that is the average's step. Float16 weights go through multi_mp_sgd_update,
        which reads them as float32 and updates the float32 average (its float16 output, unused, goes to a
        scratch copy kept per array): no cast operator per array."""
        groups = {}
        for name, p in self.params.items():
            shadow, value = self.shadow[name], first_copy(p).as_in_context(self.shadow[name].context)
            if value.dtype == np.float16:
                if name not in self.scratch:
                    self.scratch[name] = mx.nd.zeros(value.shape, shadow.context, np.float16)
                groups.setdefault((shadow.context, "mixed"), []).append((self.scratch[name], value, shadow))
            else:
                value = value if value.dtype == np.float32 else value.astype(np.float32)
                groups.setdefault((shadow.context, "plain"), []).append((shadow, value))
        rate = 1.0 - self.decay
        for (_, kind), arrays in groups.items():
            update = mx.nd.multi_mp_sgd_update if kind == "mixed" else mx.nd.multi_sgd_update
            for start in range(0, len(arrays), MULTI_SGD_MAX_ARRAYS):
                chunk = arrays[start:start + MULTI_SGD_MAX_ARRAYS]
                update(*[a for group in chunk for a in group], lrs=(1.0,) * len(chunk), wds=(rate,) * len(chunk),
                       rescale_grad=-rate, num_weights=len(chunk), out=[group[0] for group in chunk])

    def swap(self):
        """Put the averages in the network, or the live weights back (call twice to restore). The averages stay
        in float32: taking them back from a float16 network would round them to float16 at every validation."""
        if self.live is None:
            self.live = {name: first_copy(p).copy() for name, p in self.params.items()}
            for name, p in self.params.items():
                p.set_data(self.shadow[name].astype(p.dtype))
        else:
            for name, p in self.params.items():
                p.set_data(self.live[name])
            self.live = None

    def exported(self, export):
        """Run ``export()`` with the averages in the network (the live weights are put back after)."""
        self.swap()
        try:
            export()
        finally:
            self.swap()

    def running_stats(self):
        return [value for name, value in sorted(self.shadow.items())
                if name.endswith(("running_mean", "running_var"))]

    def saveable(self):
        return {name: v for name, v in self.shadow.items()}

    def load(self, path):
        loaded = mx.nd.load(path)
        for name in self.shadow:
            self.shadow[name] = loaded[name].as_in_context(self.shadow[name].context)
