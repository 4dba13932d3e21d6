"""The optimizers --optimizer names: one entry each, the name mapped to the function that builds it.

An entry names its factory as "module:function" text, so this table (and train.py's flags, runner's check of them)
stays MXNet-free: the factory's module is imported only when a run builds its trainer. A factory is called as
``factory(base, knobs, param_names)``: ``base`` the keyword arguments every MXNet optimizer takes here (learning_rate
0.0, set every step by the schedule; wd; multi_precision, for float16 weights' float32 master copies), ``knobs`` the
optimizer flags' values (Knobs), ``param_names`` the network's parameter names in the order the Trainer indexes them
(sorted). It returns an ``mxnet.optimizer.Optimizer``. docs/extending.md ("An optimizer") adds one.
"""
import dataclasses
import importlib

OPTIMIZERS_MODULE = "rn50kit.training.optimizers"  # the kit's own factories (faster CPU updates of MXNet's)


@dataclasses.dataclass(frozen=True)
class Knobs:
    """The optimizer flags' values as a factory reads them. ``betas`` and ``eps`` are the generic --opt-betas and
    --opt-eps (None: the optimizer's own default); the others are the kit's older flags, kept."""
    wd: float = 0.0
    momentum: float = 0.0
    betas: tuple = None
    eps: float = None
    lars_eta: float = 0.001
    lars_eps: float = 0.0


@dataclasses.dataclass(frozen=True)
class Entry:
    """One optimizer: ``factory`` "module:function"; ``summary`` its words in --optimizer's help; ``takes`` the
    generic knobs it reads ("momentum", "betas", "eps"): giving it another is refused, not silently ignored."""
    factory: str
    summary: str
    takes: tuple = ("momentum",)


OPTIMIZERS = {
    "sgd": Entry(f"{OPTIMIZERS_MODULE}:sgd", "sgd (momentum)"),
    "nag": Entry(f"{OPTIMIZERS_MODULE}:nag", "nag (Nesterov)"),
    "lars": Entry(f"{OPTIMIZERS_MODULE}:lars", "lars (MXNet's LARS: SGD with momentum, each weight's LR times "
                  "eta x |w| / (|g| + wd x |w| + eps); none on BatchNorm gamma/beta and biases)",
                  takes=("momentum", "eps")),
    "lamb": Entry(f"{OPTIMIZERS_MODULE}:lamb", "lamb (MXNet's LAMB: layer-wise trust ratio, betas 0.9/0.999, "
                  "eps 1e-6; --mom unused)", takes=("betas", "eps")),
}


def knobs_of(fit_cfg):
    """The Knobs of a FitConfig."""
    betas = tuple(fit_cfg.opt_betas) if fit_cfg.opt_betas else None
    return Knobs(wd=fit_cfg.wd, momentum=fit_cfg.mom, betas=betas, eps=fit_cfg.opt_eps, lars_eta=fit_cfg.lars_eta,
                 lars_eps=fit_cfg.lars_eps)


def entry(name):
    """The Entry of ``name``; a ValueError naming the choices for another."""
    if name not in OPTIMIZERS:
        raise ValueError(f"--optimizer {name}: not one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name]


def factory(name):
    """The function that builds optimizer ``name`` (its module imported now)."""
    module, _, function = entry(name).factory.partition(":")
    return getattr(importlib.import_module(module), function)


def knob_problem(name, knobs):
    """One line when a generic flag is given to an optimizer that does not read it, or None."""
    takes = entry(name).takes
    for knob, flag in (("betas", "--opt-betas"), ("eps", "--opt-eps")):
        if getattr(knobs, knob) is not None and knob not in takes:
            readers = [other for other, e in OPTIMIZERS.items() if knob in e.takes]
            return (f"{flag}: --optimizer {name} has no {knob} (used by {', '.join(readers) or 'none'}); leave "
                    f"{flag} out or choose one of those")
    if knobs.betas is not None and (len(knobs.betas) != 2 or not all(0 <= b < 1 for b in knobs.betas)):
        return f"--opt-betas takes two values in [0, 1), e.g. 0.9,0.999; got {','.join(f'{b:g}' for b in knobs.betas)}"
    if knobs.eps is not None and not knobs.eps >= 0:
        return f"--opt-eps must be 0 or more, got {knobs.eps:g}"
    return None


def optimizer_help():
    """--optimizer's help: every entry's summary."""
    summaries = [e.summary for e in OPTIMIZERS.values()]
    return ", ".join(summaries[:-1]) + " or " + summaries[-1] if len(summaries) > 1 else summaries[0]
