"""Training recipes (named hyper-parameter presets) and learning-rate schedules.

A recipe fills every hyper-parameter the user did not give on the command line. `--lr` is the absolute
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


def apply_recipe(args, parser_defaults):
    """Fill the hyper-parameters left unset (None) from ``args.recipe``; return the names filled.

    Flags owned by other modules (e.g. --min-random-area) have ordinary defaults: the recipe changes them
    only while they still hold their parser default.
    """
    if args.recipe not in RECIPES:
        raise ValueError(f"unknown recipe '{args.recipe}'; choose one of: {', '.join(RECIPES)}")
    filled = []
    for name, value in RECIPES[args.recipe].items():
        if name == "lr_per_256":
            continue
        current = getattr(args, name, None)
        if current is None or (name in parser_defaults and current == parser_defaults[name]):
            if current != value:
                filled.append(name)
            setattr(args, name, value)
    if args.lr is None:
        args.lr = RECIPES[args.recipe]["lr_per_256"] * args.batch_size / 256
        filled.append("lr")
    return filled


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
