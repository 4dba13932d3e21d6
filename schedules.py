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
SCHEDULES = ["cosine", "step", "poly", "linear"]


DEFAULT_RECIPE = "nvidia"
# Not parser defaults: the LR depends on the global batch, the epochs on --mode (scoring makes 1 pass).
DERIVED_FIELDS = ("lr_per_256", "num_epochs")


def recipe_defaults(name):
    """The parser defaults a recipe sets (command line > recipe > parser defaults, as timm's config files)."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe '{name}'; choose one of: {', '.join(RECIPES)}")
    return {key: value for key, value in RECIPES[name].items() if key not in DERIVED_FIELDS}


def recipe_lr(name, batch_size):
    """The recipe's LR for a global batch: its LR per 256 images, scaled linearly (Goyal et al. 2017)."""
    return RECIPES[name]["lr_per_256"] * batch_size / 256


def recipe_epochs(name):
    return RECIPES[name]["num_epochs"]


def get_schedule(kind, base_lr, num_epochs, warmup_epochs=0.0, steps=(), factor=0.1, power=2.0, final_lr=0.0):
    """LR as a function of the fractional epoch (epoch + step / steps_per_epoch).

    Linear warmup from 0 over ``warmup_epochs``, then: cosine to ``final_lr``; step (multiply by ``factor``
    at each epoch in ``steps``); poly ((1 - progress) ** power); linear (straight to ``final_lr``).
    """
    if kind not in SCHEDULES:
        raise ValueError(f"unknown LR schedule '{kind}'; choose one of: {', '.join(SCHEDULES)}")
    steps = sorted(steps)
    span = max(num_epochs - warmup_epochs, 1e-8)

    def schedule(epoch):
        if epoch < warmup_epochs:
            return base_lr * epoch / warmup_epochs
        progress = min(max((epoch - warmup_epochs) / span, 0.0), 1.0)
        if kind == "cosine":
            return final_lr + (base_lr - final_lr) * 0.5 * (1 + math.cos(math.pi * progress))
        if kind == "step":
            return base_lr * factor ** sum(1 for s in steps if s <= epoch)
        if kind == "poly":
            return final_lr + (base_lr - final_lr) * (1 - progress) ** power
        return final_lr + (base_lr - final_lr) * (1 - progress)
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
