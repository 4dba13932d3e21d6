"""The backend dispatch: the chosen backend's iterators, one per device; the training shape of an epoch; the check
that a run's data files exist.

Each backend is its own module (rn50kit/data/backend_*.py, protocol.py says what one provides), imported only when
it is chosen (the backends table names its builder): DALI is a large import, and the mxnet and synthetic backends
do not need it installed.
"""
import dataclasses

from rn50kit.common import backends
from rn50kit.data.iterators import PerDeviceIterator
from rn50kit.data.protocol import Feed


def epoch_train_size(cfg, epoch):
    """The training images' side in ``epoch`` (0-based), or None for --image-shape's own."""
    sizes = tuple(cfg.train_size)
    if not sizes:
        return None
    if len(sizes) == 1:
        return sizes[0]
    from rn50kit.config import lr_schedules as schedules
    return schedules.train_size(epoch, sizes[0], sizes[1], *cfg.train_size_epochs, step=cfg.train_size_step)


def train_shape(cfg, epoch=0):
    """The training batches' C,H,W: --image-shape's channels at the epoch's training size."""
    size = epoch_train_size(cfg, epoch)
    channels, height, width = cfg.image_shape
    return (channels, height, width) if size is None else (channels, size, size)


def feed_of(run_cfg):
    """The Feed of a RunConfig (config.py)."""
    return Feed(batch_size=run_cfg.fit.batch_size, dtype=run_cfg.fit.dtype or "float32", seed=run_cfg.fit.seed,
                num_classes=run_cfg.model.num_classes)


def get_data_iterators(run_cfg, rank, num_workers, local_rank, local_size, ctx, start=None, steps=None):
    """(train, val) iterators for this rank of a RunConfig; either is None when its data is not given. An elastic
    run's epoch (dali backends): ``start``, the samples of the epoch's permutation read, and ``steps`` to go."""
    build = backends.builder(run_cfg.data.data_backend)  # the backends table names each one's builder
    feed = dataclasses.replace(feed_of(run_cfg), start=start, steps=steps)
    return build(run_cfg.data, feed, rank, num_workers, local_rank, local_size, ctx)


def get_data_iterators_per_device(run_cfg, rank, num_workers, local_rank, local_size, ctxs):
    """(train, val) iterators for a process driving ``ctxs``. With several devices (--kv-store device/local) each
    gets its own pipeline on it, reading its own shard, as if it were a worker of its own (the original kit
    did the same): no device decodes the whole batch for the others."""
    if len(ctxs) == 1:
        return get_data_iterators(run_cfg, rank, num_workers, local_rank, local_size, ctxs[0])
    count = len(ctxs)
    parts = [get_data_iterators(run_cfg, rank * count + i, num_workers * count, local_rank * count + i,
                                local_size * count, ctx) for i, ctx in enumerate(ctxs)]
    train, val = zip(*parts)
    return (PerDeviceIterator(train) if train[0] is not None else None,
            PerDeviceIterator(val) if val[0] is not None else None)


