"""Training recipes (named hyper-parameter presets) and learning-rate schedules.

A recipe gives the parser its defaults: a flag on the command line wins. `--lr` is the absolute
learning rate for the global batch (runner passes it already scaled); when it is not given, the recipe's
LR per 256 images is scaled linearly: lr = lr_per_256 * batch_size / 256.
"""
import math

RECIPES = {
    # NVIDIA's 2019-10 kit: 90 epochs (50 and 250 documented; 250 with --mixup 0.2).
    "nvidia": dict(optimizer="sgd", mom=0.875, lr_per_256=0.256, lr_schedule="cosine", lr_steps=[],
                   lr_factor=0.1, warmup_epochs=5.0, wd=1 / 32768, label_smoothing=0.1, mixup=0.0,
                   num_epochs=90),
    # The 2019-01 Module kit: step schedule, no label smoothing, crop area from 5 %.
    "nvidia-2019": dict(optimizer="sgd", mom=0.9, lr_per_256=0.1, lr_schedule="step", lr_steps=[30, 60, 80],
                        lr_factor=0.1, warmup_epochs=5.0, wd=1e-4, label_smoothing=0.0, mixup=0.0,
                        num_epochs=90, min_random_area=0.05),
    # He et al. / the PyTorch reference recipe: Nesterov momentum, step schedule.
    "he": dict(optimizer="nag", mom=0.9, lr_per_256=0.1, lr_schedule="step", lr_steps=[30, 60, 80],
               lr_factor=0.1, warmup_epochs=5.0, wd=1e-4, label_smoothing=0.0, mixup=0.0, num_epochs=90),
}


DEFAULT_RECIPE = "nvidia"
# Not parser defaults: the LR depends on the global batch, the epochs on --mode (scoring makes 1 pass).
DERIVED_FIELDS = ("lr_per_256", "num_epochs")


def recipe_defaults(name):
    """The parser defaults a recipe sets (command line > recipe > parser defaults, as timm's config files)."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe '{name}'; choose one of: {', '.join(RECIPES)}")
    return {key: value for key, value in RECIPES[name].items() if key not in DERIVED_FIELDS}


def scaled_lr(lr_per_256, batch_size):
    """The one LR-scaling rule (runner's -l and the recipes'): an LR per 256 images scaled linearly to the global
    batch (Goyal et al. 2017)."""
    return lr_per_256 * batch_size / 256


def recipe_lr(name, batch_size):
    """The recipe's LR for a global batch."""
    return scaled_lr(RECIPES[name]["lr_per_256"], batch_size)


def recipe_epochs(name):
    return RECIPES[name]["num_epochs"]


def steps_for_length(name, num_epochs):
    """A recipe's --lr-steps for a run of ``num_epochs`` instead of its own length: the same fractions of the run
    (30/60/80 of 90 epochs are 10/20/26.67 of 30), rounded to hundredths of an epoch."""
    return [round(s * num_epochs / recipe_epochs(name), 2) for s in RECIPES[name]["lr_steps"]]


# After the warmup, the LR of each schedule as a small function of the progress through the remaining epochs (0 to
# 1), the epoch, and the schedule's own parameters.
def cosine(base_lr, progress, epoch, final_lr=0.0, **_):
    return final_lr + (base_lr - final_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def step(base_lr, progress, epoch, steps=(), factor=0.1, **_):
    """Multiply by ``factor`` at each epoch in ``steps``."""
    return base_lr * factor ** sum(1 for s in steps if s <= epoch)


def poly(base_lr, progress, epoch, power=2.0, final_lr=0.0, **_):
    return final_lr + (base_lr - final_lr) * (1 - progress) ** power


def linear(base_lr, progress, epoch, final_lr=0.0, **_):
    return final_lr + (base_lr - final_lr) * (1 - progress)


SCHEDULE_FUNCTIONS = {"cosine": cosine, "step": step, "poly": poly, "linear": linear}
SCHEDULES = list(SCHEDULE_FUNCTIONS)


def get_schedule(kind, base_lr, num_epochs, warmup_epochs=0.0, steps=(), factor=0.1, power=2.0, final_lr=0.0):
    """LR as a function of the fractional epoch (epoch + step / steps_per_epoch): a linear warmup from 0 over
    ``warmup_epochs``, then the schedule named ``kind`` to the end of ``num_epochs``."""
    if kind not in SCHEDULE_FUNCTIONS:
        raise ValueError(f"unknown LR schedule '{kind}'; choose one of: {', '.join(SCHEDULES)}")
    after_warmup = SCHEDULE_FUNCTIONS[kind]
    params = dict(steps=sorted(steps), factor=factor, power=power, final_lr=final_lr)
    span = max(num_epochs - warmup_epochs, 1e-8)

    def schedule(epoch):
        if epoch < warmup_epochs:
            return base_lr * epoch / warmup_epochs
        progress = min(max((epoch - warmup_epochs) / span, 0.0), 1.0)
        return after_warmup(base_lr, progress, epoch, **params)
    return schedule


def recipe_help(name):
    """A help text's "recipe: ..." for a hyper-parameter: its value in each recipe."""
    values = {recipe: fields.get(name) for recipe, fields in RECIPES.items()}

    def show(value):
        if isinstance(value, list):
            return ",".join(f"{v:g}" for v in value) or "none"
        return f"{value:g}" if isinstance(value, float) else str(value)
    if len({show(v) for v in values.values()}) == 1:
        return f"recipe: {show(next(iter(values.values())))}"
    return "recipe: " + ", ".join(f"{show(v)} ({recipe})" for recipe, v in values.items())
