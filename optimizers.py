"""MXNet's SGD with its CPU update made memory-bound: one weight per `sgd_mom_update` instead of the grouped kernel.

MXNet 1.9.1's SGD updates dense weights only through `multi_sgd_mom_update` (groups of
MXNET_OPTIMIZER_AGGREGATION_SIZE, 4 by default), even with groups of one. Its CPU kernel reaches every element
through a table of pointers and is not vectorized (`MultiSGDKernel`, src/operator/optimizer_op-inl.h). In a ResNet-50
training step (MXNet's profiler, 2-core AMD EPYC) the update of its 25.6 M weights took 52 ms in groups of 4 and 42
in groups of 1, against 29 ms with `sgd_mom_update` per weight: near the 27 ms that moving the five arrays' bytes
(weight and momentum read and written, the gradient read) takes at this machine's copy speed. On GPUs the grouped
kernel saves launches: MXNet's path is kept there.
"""
import mxnet as mx


class SGD(mx.optimizer.SGD):
    """MXNet's SGD (momentum, weight decay, lr/wd multipliers, rescale, clipping, float16 master weights), with
    float32 weights on CPU updated one at a time by the same operators MXNet's non-grouped path uses."""

    def _update_impl(self, indices, weights, grads, states, multi_precision=False):
        if not isinstance(indices, (tuple, list)):
            return self._update_impl([indices], [weights], [grads], [states], multi_precision)
        if multi_precision or any(w.context.device_type != "cpu" or w.stype != "default" or g.stype != "default"
                                  for w, g in zip(weights, grads)):
            return super()._update_impl(indices, weights, grads, states, multi_precision)
        self._update_count(indices)
        kwargs = {"rescale_grad": self.rescale_grad}
        if self.clip_gradient:
            kwargs["clip_gradient"] = self.clip_gradient
        for weight, grad, momentum, lr, wd in zip(weights, grads, states, self._get_lrs(indices),
                                                  self._get_wds(indices)):
            if momentum is None:
                mx.nd.sgd_update(weight, grad, out=weight, lr=lr, wd=wd, **kwargs)
            else:
                mx.nd.sgd_mom_update(weight, grad, momentum, out=weight, lr=lr, wd=wd, momentum=self.momentum,
                                     **kwargs)
        return None


def load_states(trainer, path):
    """``trainer.load_states(path)``, keeping our SGD: MXNet's replaces the trainer's optimizer with the one pickled
    in the file, and checkpoints written before this module hold MXNet's SGD (same state: momentum per weight)."""
    trainer.load_states(path)
    if type(trainer._optimizer) is mx.optimizer.SGD:  # one object, shared by the updaters of every context
        trainer._optimizer.__class__ = SGD
