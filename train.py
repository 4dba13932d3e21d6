"""Train or score a ResNet on ImageNet-style RecordIO with MXNet Gluon, Horovod and DALI.

Usually started by `runner`, once per worker under horovodrun; it also runs alone as one worker.
"""
import argparse
import logging
import os
import random
import sys

import data
import dali
import fit
import models


class UsageError(Exception):
    """A problem with the user's input: reported as one line, without a traceback."""


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    models.add_model_args(parser)
    fit.add_fit_args(parser)
    data.add_data_args(parser)
    dali.add_dali_args(parser)
    data.add_data_aug_args(parser)
    return parser


def setup_logging(rank):
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)


def validate_args(args, num_workers):
    if args.batch_size <= 0:
        raise UsageError(f"--batch-size must be positive, got {args.batch_size}")
    if args.batch_size % num_workers:
        raise UsageError(f"--batch-size {args.batch_size} (global) does not divide across {num_workers} workers")
    if len(args.image_shape) != 3 or args.image_shape[0] not in (3, 4):
        raise UsageError(f"--image-shape must be C,H,W with C 3 or 4, got {args.image_shape}")
    if args.data_backend != "synthetic":
        missing = data.check_data_files(args)
        if missing:
            raise UsageError(missing)
        if not args.data_train and not args.data_val:
            raise UsageError(f"no data given (--data-train/--data-val); {data.PREPARE_HINT}")


def main(args):
    import mxnet as mx
    import horovod.mxnet as hvd

    hvd.init()  # one process per worker; works alone too (size 1)
    dist = fit.Distributed(hvd)
    setup_logging(dist.rank)
    validate_args(args, dist.size)
    os.makedirs(args.workspace, exist_ok=True)
    if args.seed is not None:
        random.seed(args.seed)
        mx.random.seed(args.seed)
        import numpy as np
        np.random.seed(args.seed)
    ctx = mx.gpu(dist.local_rank) if mx.context.num_gpus() > 0 else mx.cpu()
    if dist.is_primary:
        logging.info("Start with arguments %s", vars(args))

    train_iter, val_iter = data.get_data_iterators(args, dist.rank, dist.size, dist.local_rank,
                                                   dist.local_size, ctx)
    if train_iter is None:
        raise UsageError(f"--mode {args.mode} needs training data (--data-train)")
    net = models.get_model_from_args(args)
    net.initialize(mx.init.Xavier(), ctx=ctx)  # layers with their own initializer keep it
    net.hybridize(static_alloc=True, static_shape=True)

    report = fit.fit(args, net, train_iter, val_iter, ctx, dist)
    if dist.is_primary:
        top1 = report.metrics.get("val.top1")
        if top1:
            print(f"Validation top-1: {top1[-1]:.4f}")
        print(f"Report: {os.path.abspath(os.path.join(args.workspace, args.report))}")
    return report


def run(argv=None):
    args = get_args_parser().parse_args(argv)
    args.cmd = [sys.argv[0]] + list(sys.argv[1:] if argv is None else argv)
    try:
        main(args)
    except UsageError as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    run()
