"""An exponential moving average of a network's weights (--ema-decay): updated after each optimizer step,
swapped in for validation and exported beside each checkpoint."""
import mxnet as mx


class EMA:
    """Exponential moving average of every parameter (BatchNorm statistics included), kept in float32."""

    def __init__(self, net, decay):
        self.decay = decay
        self.params = net.collect_params()
        self.shadow = {name: p.data().astype("float32").copy() for name, p in self.params.items()}

    def update(self):
        for name, p in self.params.items():
            value = p.data().astype("float32").as_in_context(self.shadow[name].context)
            self.shadow[name][:] = self.decay * self.shadow[name] + (1 - self.decay) * value

    def swap(self):
        """Exchange the live weights and the averages (call twice to restore)."""
        for name, p in self.params.items():
            live = p.data().astype("float32").copy()
            p.set_data(self.shadow[name].astype(p.dtype))
            self.shadow[name] = live

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
