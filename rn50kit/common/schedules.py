"""Training recipes (named hyper-parameter presets) and learning-rate schedules.

A recipe gives the parser its defaults: a flag on the command line wins. `--lr` is the absolute
learning rate for the global batch (runner passes it already scaled); when it is not given, the recipe's
LR per 256 images is scaled linearly: lr = lr_per_256 * batch_size / 256, or, for a recipe with LR points
(mlperf), the nearest point's LR scaled by the square root of the batch ratio (points_lr).
The batch is the effective global batch: --batch-size x --grad-accum-steps.
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
    # MLPerf Training's closed-division ResNet-50 v1.5 as NVIDIA submitted it on MXNet (v2.0-v4.0): LARS, poly
    # decay of power 2 to 1e-4 over 37 epochs after a 2-epoch warmup, evaluation every 4 epochs from epoch 3;
    # 75.9 % top-1 in about 35 epochs. LR by global batch from MLCommons' reference convergence points.
    "mlperf": dict(optimizer="lars", mom=0.9, lr_points={1632: 7.4, 3200: 11.0, 3264: 10.5}, lr_schedule="poly",
                   lr_power=2.0, lr_end=1e-4, lr_steps=[], lr_factor=0.1, warmup_epochs=2.0, wd=5e-5,
                   lars_eta=0.001, lars_eps=0.0, label_smoothing=0.1, mixup=0.0, num_epochs=37,
                   min_random_area=0.05, eval_every=4, eval_offset=2),
    # Fine-tuning published ImageNet weights (--pretrained) on a user's classes: a short cosine run at a tenth of
    # the from-scratch LR, the backbone at a tenth of that again, light augmentation (the usual transfer
    # settings of torchvision's and timm's fine-tuning guides).
    "finetune": dict(optimizer="sgd", mom=0.9, lr_per_256=0.01, lr_schedule="cosine", lr_steps=[], lr_factor=0.1,
                     warmup_epochs=1.0, wd=1e-4, label_smoothing=0.1, mixup=0.0, num_epochs=15,
                     min_random_area=0.25, backbone_lr_mult=0.1),
    # "ResNet strikes back" (Wightman, Touvron, Jegou 2021), procedure A3: 100 epochs at 160 px, tested at 224 px
    # with crop 0.95 (timm's resnet50.a3_in1k config: resize 235); LAMB at 8e-3 for a batch of 2048, weight decay
    # 0.02, 5 warmup epochs, cosine; BCE with targets thresholded at 0.2, no label smoothing; mixup 0.1, CutMix
    # 1.0 (switch probability 0.5); RandAugment rand-m6-mstd0.5-inc1 (m 6 of timm's 10 = 18 of DALI's 30, no
    # magnitude noise); no stochastic depth, no EMA, no repeated augmentation. Published: 78.1 % top-1.
    "rsb-a3": dict(optimizer="lamb", mom=0.9, lr_per_256=0.001, lr_schedule="cosine", lr_steps=[], lr_factor=0.1,
                   warmup_epochs=5.0, wd=0.02, label_smoothing=0.0, mixup=0.1, cutmix=1.0, mixup_switch_prob=0.5,
                   loss="bce", bce_target_thresh=0.2, auto_augment="randaugment", randaugment_n=2, randaugment_m=18,
                   train_size=[160], data_val_resize=235, drop_path=0.0, num_epochs=100),
    # FFCV's rn50_24_epochs.yaml (libffcv/ffcv-imagenet): SGD momentum 0.9, LR 1.7 for 8 x 512 images (0.10625 per
    # 256), "cyclic" (linear up to the peak at epoch 2, linear down to 0 at the end), weight decay 1e-4 (none on
    # BatchNorm), label smoothing 0.1, progressive resizing 160 -> 192 px between epochs 17 and 20 (multiples of
    # 32), validation at 256 px with crop ratio 224/256 (resize 293). Published: 75.6 % top-1 (with BlurPool and
    # flip test-time augmentation, which the kit has not).
    "ffcv-24": dict(optimizer="sgd", mom=0.9, lr_per_256=0.10625, lr_schedule="linear", lr_steps=[], lr_factor=0.1,
                    warmup_epochs=2.0, wd=1e-4, label_smoothing=0.1, mixup=0.0, train_size=[160, 192],
                    train_size_epochs=[17, 20], train_size_step=32, image_shape=[3, 256, 256], data_val_resize=293,
                    num_epochs=24),
}


DEFAULT_RECIPE = "nvidia"
# Not parser defaults: the LR depends on the global batch, the epochs on --mode (scoring makes 1 pass).
DERIVED_FIELDS = ("lr_per_256", "lr_points", "num_epochs")


def recipe_defaults(name):
    """The parser defaults a recipe sets (command line > recipe > parser defaults, as timm's config files)."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe '{name}'; choose one of: {', '.join(RECIPES)}")
    return {key: value for key, value in RECIPES[name].items() if key not in DERIVED_FIELDS}


def scaled_lr(lr_per_256, batch_size):
    """The one LR-scaling rule (runner's -l and the recipes'): an LR per 256 images scaled linearly to the global
    batch (Goyal et al. 2017)."""
    return lr_per_256 * batch_size / 256


def points_lr(points, batch_size):
    """(LR, how it was found) for a global batch from {batch: LR} points: the point nearest in log(batch), its LR
    scaled by sqrt(batch / point's batch) (LARS's points follow the square root: 7.4 x sqrt(2) = 10.47 ~ 10.5
    at twice 1,632); a batch of a point takes that point's LR as it is."""
    point = min(points, key=lambda b: (abs(math.log(batch_size / b)), b))
    lr = points[point] * math.sqrt(batch_size / point)
    how = f"MLCommons' point {point} -> {points[point]:g}" + \
        ("" if point == batch_size else f", scaled by sqrt({batch_size}/{point})")
    return lr, how


def recipe_lr_source(name, batch_size):
    """(the recipe's LR for a global batch, a sentence on how it was found)."""
    recipe = RECIPES[name]
    if "lr_points" in recipe:
        lr, how = points_lr(recipe["lr_points"], batch_size)
        return lr, f"recipe {name}: LR {lr:g} for global batch {batch_size} ({how})"
    lr = scaled_lr(recipe["lr_per_256"], batch_size)
    return lr, f"recipe {name}: LR {lr:g} = {recipe['lr_per_256']:g} x {batch_size}/256"


def recipe_lr_help():
    """--lr's help: each recipe's LR rule."""
    parts = []
    for name, recipe in RECIPES.items():
        if "lr_points" in recipe:
            points = ", ".join(f"{b} -> {lr:g}" for b, lr in sorted(recipe["lr_points"].items()))
            parts.append(f"{name}: LARS points {points}, the nearest scaled by sqrt(batch / its batch)")
        else:
            parts.append(f"{name}: {recipe['lr_per_256']:g} per 256")
    return "; ".join(parts)


def recipe_lr(name, batch_size):
    """The recipe's LR for a global batch."""
    return recipe_lr_source(name, batch_size)[0]


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


def train_size(epoch, start, end, first_epoch, last_epoch, step=32):
    """Progressive resizing, as FFCV's get_resolution: ``start`` up to epoch ``first_epoch`` (0-based), ``end``
    from ``last_epoch`` on, between them the linear interpolation rounded to the nearest multiple of ``step``."""
    if epoch <= first_epoch:
        return start
    if epoch >= last_epoch:
        return end
    size = start + (end - start) * (epoch - first_epoch) / (last_epoch - first_epoch)
    return int(round(size / step)) * step


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
