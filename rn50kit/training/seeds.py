"""The run's seed: --seed, or, for a training run without it, one drawn by rank 0 and recorded as if typed (so
replaying the run replays its draws); and the generators it seeds."""
import random

from rn50kit.training.prelaunch import TRAINING_MODES
from rn50kit.weights import checkpoint


def drawn_seed(cfg, dist):
    """The seed a training run without --seed runs with, as if typed: config.toml and the checkpoints record it,
    so replaying the run replays its draws (issue 58). A resumed run keeps the one its newest checkpoint recorded.
    Rank 0 draws and every rank takes it. None: a seed was given, the run does not train, or it is elastic (no
    collective before an elastic run's first sync; its readers are seeded 0 without --seed)."""
    fit_cfg = cfg.fit
    if fit_cfg.seed is not None or fit_cfg.mode not in TRAINING_MODES or cfg.data.test_io or dist.elastic:
        return None
    seed = 0
    if dist.is_primary:
        saved = checkpoint.list_complete(checkpoint.workspace_path(fit_cfg.workspace, fit_cfg.model_prefix)) \
            if fit_cfg.resume == "auto" else []
        seed = saved[-1].get("seed") if saved and isinstance(saved[-1].get("seed"), int) else \
            random.SystemRandom().randrange(1, 2 ** 31)
    return int(dist.sum([seed], "seed.drawn")[0])  # float64: exact below 2**53


def seed_everything(seed):
    """--seed: Python's, MXNet's and NumPy's generators."""
    if seed is None:
        return
    import mxnet as mx
    import numpy as np
    random.seed(seed)
    mx.random.seed(seed)
    np.random.seed(seed)
