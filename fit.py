"""The training loop: distributed SGD, LR schedule, validation, checkpoints and the report."""
import logging
import math
import os
import time

import mxnet as mx
from mxnet import autograd, gluon

from report import Report

log = logging.getLogger("rn50")


def add_fit_args(parser):
    group = parser.add_argument_group("Training")
    group.add_argument("--mode", default="train_val", choices=["train_val", "train"], help="what to run")
    group.add_argument("--seed", type=int, default=None, help="random seed (python, numpy, MXNet and DALI)")
    group.add_argument("--kv-store", default="horovod", choices=["horovod"], help="gradient reduction")
    group.add_argument("--dtype", default="float32", choices=["float32"], help="training precision")
    group.add_argument("--batch-size", type=int, default=192, help="global batch size (all workers)")
    group.add_argument("--num-epochs", type=int, default=90, help="number of epochs")
    group.add_argument("--lr", type=float, default=0.256, help="learning rate (for the global batch)")
    group.add_argument("--lr-schedule", default="cosine", choices=["cosine"], help="learning rate schedule")
    group.add_argument("--warmup-epochs", type=float, default=5, help="linear warmup from 0, in epochs")
    group.add_argument("--mom", type=float, default=0.875, help="SGD momentum")
    group.add_argument("--wd", type=float, default=1 / 32768, help="weight decay")
    group.add_argument("--label-smoothing", type=float, default=0.1, help="label smoothing factor")
    group.add_argument("--disp-batches", type=int, default=20, help="log every N iterations")
    group.add_argument("--workspace", default="./", help="directory for checkpoints and the report")
    group.add_argument("--model-prefix", default="model", help="checkpoint file prefix, inside --workspace")
    group.add_argument("--report", default="report.json", help="JSON report file, inside --workspace")
    return group


def cosine_lr(base_lr, warmup_epochs, num_epochs):
    """LR as a function of fractional epoch: linear warmup from 0, then a half cosine to 0."""
    def schedule(epoch):
        if epoch < warmup_epochs:
            return base_lr * epoch / warmup_epochs
        span = max(num_epochs - warmup_epochs, 1e-8)
        progress = min((epoch - warmup_epochs) / span, 1.0)
        return base_lr * 0.5 * (1 + math.cos(math.pi * progress))
    return schedule


class Distributed:
    """Rank information and the few collectives the loop needs (Horovod; one process works too)."""

    def __init__(self, hvd):
        self.hvd = hvd
        self.rank, self.size = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()

    @property
    def is_primary(self):
        return self.rank == 0

    def sum(self, values, name):
        """Sum a list of floats over all ranks."""
        array = mx.nd.array(values, dtype="float64")
        return self.hvd.allreduce(array, op=self.hvd.Sum, name=name).asnumpy().tolist()

    def average_(self, params, name):
        """Average parameters in place over all ranks (BatchNorm running statistics)."""
        for i, param in enumerate(params):
            self.hvd.allreduce_(param.data(), op=self.hvd.Average, name=f"{name}.{i}")


def running_stats(net):
    return [p for name, p in sorted(net.collect_params().items())
            if name.endswith("running_mean") or name.endswith("running_var")]


def evaluate(net, val_iter, ctx, dist, loss_fn):
    """Top-1, top-5 and loss over the whole validation set, each sample counted once over all ranks."""
    correct1 = correct5 = loss_sum = count = 0.0
    durations = []
    for batch in val_iter:
        start = time.time()
        data = batch.data[0].as_in_context(ctx)
        label = batch.label[0].as_in_context(ctx)
        valid = data.shape[0] - batch.pad
        logits = net(data).astype("float32")[:valid]
        label = label[:valid]
        top5 = mx.nd.topk(logits, k=min(5, logits.shape[1]), ret_typ="indices")
        hits = top5 == label.reshape((-1, 1)).astype(top5.dtype)
        correct1 += hits[:, 0].sum().asscalar()
        correct5 += hits.sum().asscalar()
        loss_sum += loss_fn(logits, label).sum().asscalar()
        count += valid
        durations.append(time.time() - start)
    correct1, correct5, loss_sum, count = dist.sum([correct1, correct5, loss_sum, count], "val.counts")
    count = max(count, 1)
    return {"top1": correct1 / count, "top5": correct5 / count, "loss": loss_sum / count,
            "durations": durations, "samples": count}


def save_checkpoint(net, prefix, epoch):
    """Write `<prefix>-symbol.json` and `<prefix>-NNNN.params` atomically (temporary files, then rename)."""
    directory, name = os.path.split(prefix)
    tmp_prefix = os.path.join(directory, f".tmp-{name}")
    net.export(tmp_prefix, epoch=epoch)
    os.replace(f"{tmp_prefix}-{epoch:04d}.params", f"{prefix}-{epoch:04d}.params")
    os.replace(f"{tmp_prefix}-symbol.json", f"{prefix}-symbol.json")
    return f"{prefix}-{epoch:04d}.params"


def fit(args, net, train_iter, val_iter, ctx, dist):
    """Train ``net`` (initialised, hybridized) for ``args.num_epochs``; return the report."""
    hvd = dist.hvd
    # Rank 0's initial weights go to every rank, so all start (and, with averaged gradients, stay) equal.
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    optimizer_params = {"learning_rate": 0.0, "wd": args.wd, "momentum": args.mom, "multi_precision": True}
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", optimizer_params)
    num_classes = args.num_classes
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)
    eval_loss = gluon.loss.SoftmaxCrossEntropyLoss()
    schedule = cosine_lr(args.lr, args.warmup_epochs, args.num_epochs)
    steps_per_epoch = len(train_iter)
    local_batch = args.batch_size // dist.size
    eta = args.label_smoothing
    report = Report(model=f"{args.arch}", ngpus=dist.size, cmd=args.cmd)
    prefix = os.path.join(args.workspace, args.model_prefix)
    start_time = time.time()

    for epoch in range(args.num_epochs):
        loss_total, loss_count, tic = 0.0, 0, time.time()
        durations = []
        for step, batch in enumerate(train_iter):
            step_start = time.time()
            trainer.set_learning_rate(schedule(epoch + step / steps_per_epoch))
            data = batch.data[0].as_in_context(ctx)
            label = batch.label[0].as_in_context(ctx)
            target = label.one_hot(num_classes, on_value=1 - eta + eta / num_classes, off_value=eta / num_classes)
            with autograd.record():
                loss = loss_fn(net(data).astype("float32"), target)
            loss.backward()
            trainer.step(local_batch)
            loss_total += loss.mean().asscalar()
            loss_count += 1
            durations.append(time.time() - step_start)
            if dist.is_primary and args.disp_batches and (step + 1) % args.disp_batches == 0:
                speed = args.batch_size * (step + 1) / (time.time() - tic)
                left = (steps_per_epoch - step - 1) + (args.num_epochs - epoch - 1) * steps_per_epoch
                log.info("Epoch[%d] Batch[%d/%d] %.1f img/s loss %.4f lr %.5f ETA %s", epoch, step + 1,
                         steps_per_epoch, speed, loss_total / loss_count, trainer.learning_rate,
                         format_seconds(left * args.batch_size / max(speed, 1e-9)))
        train_loss = dist.sum([loss_total, loss_count], "train.loss")
        report.add_epoch("train", loss=train_loss[0] / max(train_loss[1], 1), durations=durations,
                         batch_size=args.batch_size)
        if dist.is_primary:
            log.info("Epoch[%d] train loss %.4f, %.1f img/s", epoch, train_loss[0] / max(train_loss[1], 1),
                     args.batch_size * len(durations) / max(sum(durations), 1e-9))
        # Each rank keeps its own BatchNorm statistics: average them so validation and checkpoints
        # do not depend on the rank.
        dist.average_(running_stats(net), f"bn.{epoch}")
        if val_iter is not None and args.mode == "train_val":
            metrics = evaluate(net, val_iter, ctx, dist, eval_loss)
            report.add_epoch("val", top1=metrics["top1"], top5=metrics["top5"], loss=metrics["loss"],
                             durations=metrics["durations"], batch_size=args.batch_size)
            if dist.is_primary:
                log.info("Epoch[%d] validation top1 %.4f top5 %.4f loss %.4f (%d samples)", epoch,
                         metrics["top1"], metrics["top5"], metrics["loss"], metrics["samples"])
        if dist.is_primary:
            path = save_checkpoint(net, prefix, epoch + 1)
            log.info("Saved checkpoint %s", path)
    report.total_duration = time.time() - start_time
    if dist.is_primary:
        report.save(os.path.join(args.workspace, args.report))
    return report


def format_seconds(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
