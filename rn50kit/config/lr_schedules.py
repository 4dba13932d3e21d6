"""Learning-rate schedules (--lr-schedule) and progressive resizing (--train-size START,END): plain functions of the
fractional epoch, MXNet-free. They live beside the flags that name them (fit_flags' --lr-schedule choices are this
table's keys), so the configuration home lists what it can ask for without importing the training loop."""
import math


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
