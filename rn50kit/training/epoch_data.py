"""The training data of each epoch: with --seed a fresh reader per epoch seeded by (seed, epoch), with
--train-size START,END a pipeline at the epoch's image size; an elastic run's epochs are built by its worlds."""
import math

from rn50kit.config.cli import UsageError
from rn50kit.data import loaders


def training_data(cfg, dist, ctxs, elastic):
    """(a function from an epoch to its training iterator, the validation iterator). ``elastic``: an elastic run's
    driver (each world builds its own pipelines; fit asks an epoch's steps, for the MLPerf log), or None."""
    if elastic is not None:
        steps = range(math.ceil(elastic.epoch_samples / cfg.fit.batch_size))
        return (lambda epoch: steps), None
    train_iter, val_iter = loaders.get_data_iterators_per_device(cfg, dist.rank, dist.size, dist.local_rank,
                                                              dist.local_size, ctxs)
    if train_iter is None:
        raise UsageError(f"--mode {cfg.fit.mode} needs training data (--data-train)")
    return train_iterator_factory(cfg, dist, ctxs, train_iter), val_iter


def epoch_reader(cfg, epoch, seed, **changes):
    """The RunConfig changes (``changes`` and these) of ``epoch``'s training reader: its record order seeded by
    (``seed``, epoch), None keeping the run's, and with --train-size START,END the epoch's image size."""
    if len(cfg.data.train_size) == 2:
        changes.update(data__train_size=(loaders.epoch_train_size(cfg.data, epoch),), data__train_size_epochs=())
    if seed is not None:
        changes.update(fit__seed=seed + 100003 * epoch)
    return changes


def train_iterator_factory(cfg, dist, ctxs, first):
    """Training iterator per epoch. With --seed each epoch gets a fresh reader seeded by (seed, epoch), so a
    run resumed at any epoch sees exactly the batches an uninterrupted run would. With progressive resizing
    (--train-size START,END) a pipeline is also rebuilt, at the epoch's size, whenever the size changes. A
    pipeline no longer needed is let go before the next is built (it holds GPU memory): the epoch-0 one once used,
    or at once in a resumed run."""
    sized = len(cfg.data.train_size) == 2
    if cfg.fit.seed is None and not sized:
        return lambda epoch: first  # one pipeline for the whole run
    held = [first]
    built = {"size": loaders.epoch_train_size(cfg.data, 0), "iterator": None}

    def make(epoch):
        size = loaders.epoch_train_size(cfg.data, epoch)
        if epoch == 0 and held:
            if cfg.fit.seed is None:
                built["iterator"] = held[0]  # reused while the size stays
            return held.pop()  # built with --seed, the seed epoch 0 gets, at epoch 0's size
        held.clear()
        if cfg.fit.seed is None and size == built["size"] and built["iterator"] is not None:
            return built["iterator"]
        changes = epoch_reader(cfg, epoch, cfg.fit.seed, data__data_val=None)  # only the training pipeline
        built["iterator"] = None  # let the previous pipeline go before the next one is built
        built.update(size=size, iterator=loaders.get_data_iterators_per_device(
            cfg.replace(**changes), dist.rank, dist.size, dist.local_rank, dist.local_size, ctxs)[0])
        return built["iterator"]
    return make
