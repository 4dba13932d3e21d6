"""MXNet's SGD, LARS and LAMB with their CPU updates made memory-bound: per-weight kernels and BLAS norms.

MXNet 1.9.1's SGD updates dense weights only through `multi_sgd_mom_update` (groups of
MXNET_OPTIMIZER_AGGREGATION_SIZE, 4 by default), even with groups of one. Its CPU kernel reaches every element
through a table of pointers and is not vectorized (`MultiSGDKernel`, src/operator/optimizer_op-inl.h). In a ResNet-50
training step (MXNet's profiler, 2-core AMD EPYC) the update of its 25.6 M weights took 52 ms in groups of 4 and 42
in groups of 1, against 29 ms with `sgd_mom_update` per weight: near the 27 ms that moving the five arrays' bytes
(weight and momentum read and written, the gradient read) takes at this machine's copy speed. On GPUs the grouped
kernel saves launches: MXNet's path is kept there.

LARS and LAMB need each weight's norm (and its gradient's, or its update's). MXNet 1.9.1 takes them with
`multi_sum_sq` (LARS) or `NDArray.norm` (LAMB): scalar loops on CPU, 2.0 and 8.7 ms for the 2.4 M elements of a
512x512x3x3 convolution, against 0.13 ms for a BLAS dot product of the flattened array with itself. LARS also updates
in groups (`preloaded_multi_sgd_mom_update`, unvectorized like SGD's), LAMB in groups of 45 (`multi_lamb_update`).
A whole ResNet-50 update, same machine: LARS 105-114 ms -> 43, LAMB 774-820 ms -> 179.

At the end, the optimizer a run trains with, from its flags: weight-decay groups (none on BatchNorm gamma/beta and
biases), the registry's factories of the kit's optimizers (rn50kit/config/optimizer_registry.py names them; a new
optimizer is a module of its own, docs/extending.md), and the trainer that applies the optimizer (Horovod's
DistributedTrainer or a Gluon Trainer on a kvstore).
"""
import mxnet as mx
import numpy as np
from mxnet import gluon

from rn50kit.config import optimizer_registry


class SGD(mx.optimizer.SGD):
    """MXNet's SGD (momentum, weight decay, lr/wd multipliers, rescale, clipping, float16 master weights), with
    float32 weights on CPU updated one at a time by the same operators MXNet's non-grouped path uses."""

    def _update_impl(self, indices, weights, grads, states, multi_precision=False):
        indices, weights, grads, states = _as_lists(indices, weights, grads, states)
        if multi_precision or not cpu_dense(weights, grads):
            return super()._update_impl(indices, weights, grads, states, multi_precision)
        self._update_count(indices)
        sgd_steps(self, weights, grads, states, self._get_lrs(indices), self._get_wds(indices))
        return None


def sgd_steps(optimizer, weights, grads, momenta, lrs, wds):
    """Momentum SGD (plain SGD where a weight has no momentum state), one weight at a time, with ``optimizer``'s
    momentum, rescale and clipping."""
    kwargs = {"rescale_grad": optimizer.rescale_grad}
    if optimizer.clip_gradient:
        kwargs["clip_gradient"] = optimizer.clip_gradient
    for weight, grad, momentum, lr, wd in zip(weights, grads, momenta, lrs, wds):
        if momentum is None:
            mx.nd.sgd_update(weight, grad, out=weight, lr=lr, wd=wd, **kwargs)
        else:
            mx.nd.sgd_mom_update(weight, grad, momentum, out=weight, lr=lr, wd=wd, momentum=optimizer.momentum,
                                 **kwargs)


def cpu_dense(weights, grads):
    """Whether these weights take our path: dense float32 weights and gradients in host memory."""
    return all(w.context.device_type == "cpu" and w.dtype == np.float32 and w.stype == "default"
               and g.stype == "default" for w, g in zip(weights, grads))


def sum_of_squares(array):
    """The sum of the squares of ``array``'s elements, a (1,) NDArray: one BLAS dot product (see the module's doc)."""
    flat = array.reshape((-1,))
    return mx.nd.dot(flat, flat)


def _as_lists(*items):
    return items if isinstance(items[0], (tuple, list)) else tuple([item] for item in items)


class LARS(mx.optimizer.LARS):
    """MXNet's LARS (its grouped path's arithmetic: `multi_lars` turns each weight's LR into
    lr x eta x |w| / (|g| x rescale + wd x |w| + eps), BatchNorm gamma/beta and biases keep theirs), with the norms
    taken by BLAS and float32 weights on CPU then updated one at a time by `sgd_mom_update` (as optimizers.SGD).
    The scaled LRs come back to Python once per call, and the Trainer makes one call per step (``aggregate_num``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        take_whole_steps(self)

    @staticmethod
    def keeps_its_lr(name):
        return name.endswith(("gamma", "beta", "bias"))  # as MXNet's LARS decides

    def _update_impl(self, indices, weights, grads, states, multi_precision=False):
        indices, weights, grads, states = _as_lists(indices, weights, grads, states)
        if multi_precision or self.momentum_correction or not cpu_dense(weights, grads):
            # MXNet's path in MXNet's groups: its kernels hold at most 60 weights, and its momentum correction
            # changes from one group to the next
            for start in range(0, len(indices), self.group_size):
                end = start + self.group_size
                super()._update_impl(indices[start:end], weights[start:end], grads[start:end], states[start:end],
                                     multi_precision)
            return None
        self._update_count(indices)
        lrs, wds = self._get_lrs(indices), self._get_wds(indices)
        scaled = [k for k, index in enumerate(indices) if not self.keeps_its_lr(self.idx2name.get(index, str(index)))]
        if scaled:
            cpu = weights[0].context
            new_lrs = mx.nd.multi_lars(
                mx.nd.array([lrs[k] for k in scaled], ctx=cpu, dtype="float32"),
                mx.nd.concat(*[sum_of_squares(weights[k]) for k in scaled], dim=0),
                mx.nd.concat(*[sum_of_squares(grads[k]) for k in scaled], dim=0),
                mx.nd.array([wds[k] for k in scaled], ctx=cpu, dtype="float32"),
                eta=self.eta, eps=self.eps, rescale_grad=self.rescale_grad)
            for k, lr in zip(scaled, new_lrs.asnumpy().tolist()):
                lrs[k] = lr
        sgd_steps(self, weights, grads, states, lrs, wds)  # (momentum 0: LARS creates no momentum states)
        return None


def take_whole_steps(lars):
    """Every weight of a step in one call (the Trainer's Updater groups by ``aggregate_num``): one wait for the scaled
    LRs per step, not one per group. ``group_size`` keeps MXNet's group (MXNET_OPTIMIZER_AGGREGATION_SIZE, 4) for
    MXNet's path."""
    if lars.aggregate_num != WHOLE_STEP:
        lars.group_size = max(1, lars.aggregate_num)
    lars.aggregate_num = WHOLE_STEP


WHOLE_STEP = 1 << 16


class LAMB(mx.optimizer.LAMB):
    """MXNet's LAMB with timm's rule for the parameters without weight decay, and the norms taken by BLAS for
    float32 weights on CPU (its per-weight path there: `lamb_update_phase1`, the norms of the weight and of the
    update, then `lamb_update_phase2`; MXNet's grouped `multi_lamb_update` elsewhere, as on GPUs).

    timm's LAMB (timm/optim/lamb.py, `if weight_decay != 0 or always_adapt`), whose procedure the rsb recipes cite,
    scales the step by the trust ratio |w| / |step| only for parameters with weight decay: BatchNorm gamma/beta and
    biases (wd_mult 0, set_wd_groups) take the plain bias-corrected Adam step, lr m_hat / (sqrt(v_hat) + eps).
    MXNet's kernels scale every parameter's step, so a zero-initialised beta moved about lr times its own tiny norm
    per step (10 steps at LR 0.01: -0.011 against timm's -0.100). MXNet's kernels take the plain step where the
    weight's norm is 0 (optimizer_op-inl.h LambUpdatePhaseTwoKernel, multi_lamb.cc/.cu step 2), after clamping it
    to ``upper_bound``: with an upper bound of 0 they compute timm's step for those parameters."""

    def _update_impl(self, index, weight, grad, state, multi_precision=False):
        listed = isinstance(index, (tuple, list))
        indices, weights, grads, states = _as_lists(index, weight, grad, state)
        for adapt in (True, False):
            chosen = [k for k, i in enumerate(indices) if (self._get_wd(i) != 0) == adapt]
            if not chosen:
                continue
            group = [[items[k] for k in chosen] for items in (indices, weights, grads, states)]
            if not multi_precision and cpu_dense(group[1], group[2]):
                self._cpu_update(*group, adapt)
            elif adapt:
                super()._update_impl(*(group if listed else [items[0] for items in group]), multi_precision)
            else:
                self._plain_update(*group, multi_precision)
        return None

    def _kwargs(self):
        kwargs = {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon, "rescale_grad": self.rescale_grad,
                  "bias_correction": self.bias_correction}
        if self.clip_gradient:
            kwargs["clip_gradient"] = self.clip_gradient
        return kwargs

    def _cpu_update(self, indices, weights, grads, states, adapt):
        bounds = {}
        if self.lower_bound:
            bounds["lower_bound"] = self.lower_bound
        if self.upper_bound:
            bounds["upper_bound"] = self.upper_bound
        for index, weight, grad, (mean, var) in zip(indices, weights, grads, states):
            self._update_count(index)
            update = mx.nd.lamb_update_phase1(weight, grad, mean, var, wd=self._get_wd(index),
                                              t=self._index_update_count[index], **self._kwargs())
            if adapt:
                norms = mx.nd.sqrt(sum_of_squares(weight)), mx.nd.sqrt(sum_of_squares(update))
                mx.nd.lamb_update_phase2(weight, update, *norms, lr=self._get_lr(index), out=weight, **bounds)
            else:  # a weight norm of 0: the trust ratio is 1
                zero = mx.nd.zeros((1,), weight.context)
                mx.nd.lamb_update_phase2(weight, update, zero, zero, lr=self._get_lr(index), out=weight)

    def _plain_update(self, indices, weights, grads, states, multi_precision):
        """MXNet's grouped kernels (as its LAMB groups them) with the weight norm clamped to 0: the plain step."""
        steps, lrs, wds = [], [], []
        for index in indices:
            self._update_count(index)
            steps.append(self._index_update_count[index])
            lrs.append(self._get_lr(index))
            wds.append(self._get_wd(index))
        size = max(1, self.aggregate_num)
        for start in range(0, len(indices), size):
            part = slice(start, start + size)
            kwargs = dict(out=weights[part], step_count=steps[part], lrs=lrs[part], wds=wds[part], upper_bound=0.0,
                          **self._kwargs())
            if multi_precision:  # state: (float32 master weights, (mean, var))
                mean, var = zip(*[moments for _, moments in states[part]])
                masters = [master for master, _ in states[part]]
                mx.nd.contrib.multi_mp_lamb_update(weights[part], grads[part], mean, var, masters, **kwargs)
            else:
                mean, var = zip(*states[part])
                mx.nd.contrib.multi_lamb_update(weights[part], grads[part], mean, var, **kwargs)


BY_NAME = {"sgd": SGD, "lars": LARS, "lamb": LAMB}  # MXNet's registered names


def create(name, **params):
    """The optimizer ``name`` (MXNet's registered name) with ``params``: ours for SGD, LARS and LAMB, else MXNet's."""
    return BY_NAME[name](**params) if name in BY_NAME else mx.optimizer.create(name, **params)


def no_decay(name):
    """BatchNorm gamma/beta and biases: decaying them only hurts (Goyal et al. 2017; NVIDIA's README)."""
    return name.endswith(("gamma", "beta", "bias"))


def set_wd_groups(net, decay_all=False):
    for name, param in net.collect_params().items():
        param.wd_mult = 1.0 if decay_all or not no_decay(name) else 0.0


# The registry's factories for the kit's optimizers: factory(base, knobs, param_names) -> an MXNet optimizer
# (optimizer_registry's doc). ``base``: learning_rate (0.0: the schedule sets it every step), wd, multi_precision.
def sgd(base, knobs, param_names):
    return SGD(momentum=knobs.momentum, **base)


def nag(base, knobs, param_names):
    return mx.optimizer.create("nag", momentum=knobs.momentum, **base)


def lars(base, knobs, param_names):
    """MXNet 1.9.1's LARS decides which parameters get no trust ratio by their names (ending in gamma, beta or
    bias), read from ``param_idx2name``, which a Gluon Trainer does not fill in (every parameter would get one):
    it is given here, indexed as the Trainer indexes (parameters sorted by name). Its momentum correction
    (momentum x LR / previous LR) is off: the LR changes every step, and from a warmup's first LR of 0 it would
    make the second step's momentum 2x. --opt-eps, when given, is its eps (else --lars-eps)."""
    eps = knobs.lars_eps if knobs.eps is None else knobs.eps
    return LARS(momentum=knobs.momentum, eta=knobs.lars_eta, eps=eps, momentum_correction=False,
                param_idx2name=dict(enumerate(param_names)), **base)


def lamb(base, knobs, param_names):
    """Its own moments, no momentum: MXNet's defaults, timm's (betas 0.9/0.999, eps 1e-6, bias correction) unless
    --opt-betas/--opt-eps say otherwise."""
    beta1, beta2 = knobs.betas or (0.9, 0.999)
    return LAMB(beta1=beta1, beta2=beta2, epsilon=1e-6 if knobs.eps is None else knobs.eps, **base)


def build(name, knobs, param_names):
    """The optimizer the registry's entry ``name`` makes with ``knobs`` (optimizer_registry.Knobs) for parameters
    ``param_names`` (sorted, as the Trainer indexes them)."""
    base = {"learning_rate": 0.0, "wd": knobs.wd, "multi_precision": True}
    return optimizer_registry.factory(name)(base, knobs, list(param_names))


def optimizer_params(net, optimizer, wd, momentum, lars_eta=0.001, lars_eps=0.0):
    """The keyword arguments MXNet's optimizer ``optimizer`` takes for the kit's built-in ones (the LR is set every
    step), as the registry's factories give them (for tools that build an optimizer by MXNet's name)."""
    params = {"learning_rate": 0.0, "wd": wd, "multi_precision": True}
    if optimizer != "lamb":
        params["momentum"] = momentum
    if optimizer == "lars":
        params.update(eta=lars_eta, eps=lars_eps, momentum_correction=False,
                      param_idx2name=dict(enumerate(sorted(net.collect_params().keys()))))
    return params


def make_trainer(net, dist, kvstore, optimizer, wd, momentum, fp16_allreduce=False, num_groups=0, lars_eta=0.001,
                 lars_eps=0.0, betas=None, eps=None):
    """The optimizer named ``optimizer`` in the registry, applied by Horovod's DistributedTrainer or a Gluon Trainer
    on a kvstore."""
    knobs = optimizer_registry.Knobs(wd=wd, momentum=momentum, betas=betas, eps=eps, lars_eta=lars_eta,
                                     lars_eps=lars_eps)
    params = net.collect_params()
    optimizer = build(optimizer, knobs, sorted(params.keys()))
    if kvstore == "horovod":
        hvd = dist.hvd
        compression = hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none
        trainer_class = one_dtype_at_a_time(dist) if dist.elastic else hvd.DistributedTrainer
        return trainer_class(params, optimizer, None, compression=compression, num_groups=num_groups)
    store = mx.kvstore.create(kvstore) if kvstore else None
    return gluon.Trainer(params, optimizer, None, kvstore=store, update_on_kvstore=False)


def one_dtype_at_a_time(dist):
    """Horovod's DistributedTrainer allreducing the gradients one dtype at a time, each collective waited for
    before the next, for elastic runs: a lost peer then fails one collective, not several at once (MXNet 1.9.1's
    engine records failures in an unlocked list: Distributed.one_at_a_time, docs/design.md). Horovod 0.28.1's own
    _allreduce_grads (horovod/mxnet/__init__.py) enqueues one grouped allreduce per dtype without waiting: a
    float16 network's float16 gradients and its BatchNorm's float32 ones were two collectives in flight, and the
    step's vote a third. Its arguments are theirs: average or sum (the average taken in the framework, by
    ``_scale``, without NCCL 2.10+), the scale factors, the process set, the compression."""
    class OneDtypeAtATime(dist.hvd.DistributedTrainer):
        def _allreduce_grads(self):
            if self._process_set.size() == 1 or not self._process_set.included():
                return
            grads = [param.list_grad()[0] for param in self._params if param.grad_req != "null"]
            packed = [self._compression.compress(grad) for grad in grads]
            dist.one_at_a_time([tensor for tensor, _ in packed], self._prefix + "grads",
                               average=not self._average_in_framework,
                               prescale_factor=1.0 / self._gradient_predivide_factor,
                               postscale_factor=self._postscale_factor, process_set=self._process_set)
            if self._compression is not dist.hvd.Compression.none:
                for grad, (tensor, ctx) in zip(grads, packed):
                    grad[:] = self._compression.decompress(tensor, ctx)
    return OneDtypeAtATime


def accumulate_gradients(params):
    """Gradient accumulation: backward passes add to the gradients (zeroed after each update)."""
    for param in params.values():
        if param.grad_req != "null":
            param.grad_req = "add"


def zero_accumulated(params):
    for param in params:
        if param.grad_req == "add":
            param.zero_grad()


def trainer_for(net, dist, cfg):
    """make_trainer with a FitConfig's optimizer flags (a fresh run's, and an elastic run's after each reset).
    An elastic run allreduces the gradients one dtype at a time, each waited for (one_dtype_at_a_time): a lost
    peer fails every collective in flight at once, which corrupts MXNet 1.9.1's engine when there are several
    (docs/design.md)."""
    knobs = optimizer_registry.knobs_of(cfg)
    return make_trainer(net, dist, cfg.kv_store, cfg.optimizer, cfg.wd, cfg.mom, cfg.fp16_allreduce,
                        1 if dist.elastic else cfg.horovod_num_groups, cfg.lars_eta, cfg.lars_eps, knobs.betas,
                        knobs.eps)
