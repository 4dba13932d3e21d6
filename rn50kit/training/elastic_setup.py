"""An elastic run's driver built from its RunConfig (rn50kit/training/elastic.py runs it): what an elastic run
cannot do refused in one line, before the network or any collective; the iterators of each world's plan (the
training records from the first one not read yet); and its trainer, made again after each reset."""
from rn50kit.common import backends
from rn50kit.config.cli import UsageError
from rn50kit.data import loaders, record_files
from rn50kit.training import optimizers
from rn50kit.training.epoch_data import epoch_reader


def elastic_training(cfg, net, ctxs, dist, lock):
    """An elastic run's driver (rn50kit/training/elastic.py), or None for a run of a fixed world. Its epochs are
    built here: the training records from the first one not read yet, the batch of the world's plan. ``lock``:
    the workspace's (workspace.hold_workspace), which a worker that becomes rank 0 takes."""
    if not dist.elastic:
        return None
    from rn50kit.training import elastic  # Horovod's elastic driver: loaded for elastic runs only
    refusal = backends.elastic_refusal(cfg.data.data_backend)  # first: synthetic data has no --data-train either
    if refusal:
        raise UsageError(refusal)
    if not cfg.data.data_train:
        raise UsageError(f"--mode {cfg.fit.mode} needs training data (--data-train)")
    fit_cfg = cfg.fit
    if fit_cfg.horovod_num_groups > 1:  # see optimizers.trainer_for
        raise UsageError(f"elastic runs allreduce the gradients as one group (a lost worker fails every collective "
                         f"in flight at once, which MXNet 1.9.1 does not survive when there are several); leave out "
                         f"--horovod-num-groups {fit_cfg.horovod_num_groups}")

    def make_iterators(plan, epoch, start, steps, with_val):
        changes = epoch_reader(cfg, epoch, fit_cfg.seed or 0, fit__batch_size=plan.micro_batch,
                               **({} if with_val else {"data__data_val": None}))
        return loaders.get_data_iterators(cfg.replace(**changes), dist.rank, dist.size, dist.local_rank,
                                          dist.local_size, ctxs[0], start=start, steps=steps)

    def make_trainer():
        return optimizers.trainer_for(net, dist, fit_cfg)
    samples = cfg.data.num_examples or len(record_files.open_record_files(cfg.data)["train"])
    return elastic.ElasticTraining(dist.hvd, dist, net, fit_cfg.batch_size * fit_cfg.grad_accum_steps,
                                   max(1, fit_cfg.batch_size // dist.size), samples, make_iterators, make_trainer,
                                   fit_cfg.commit_every, fit_cfg.elastic_batch == "keep", fit_cfg.grad_accum_steps,
                                   lock)
