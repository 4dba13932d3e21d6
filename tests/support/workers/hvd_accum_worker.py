"""Run by tests/e2e/test_mlperf.py under horovodrun -np 2: on each rank, one epoch of the loop's own train_one_epoch
on the tiny network twice, from the same weights and on this rank's own images: 3 accumulated micro-batches of 4
per optimizer step (global batch 8, --grad-accum-steps 3), then one batch of 12 per step (global batch 24), the
same images in the same order. Saves each run's trained parameters as <out>/<run>-rank<r>.npz."""
import os
import sys

import numpy as np

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.dirname(TESTS), TESTS]  # the kit's modules, and tests/support
import horovod.mxnet as hvd  # noqa: E402

import fit  # noqa: E402
from rn50kit.training import distributed, precision  # noqa: E402
from rn50kit.training.stop_signals import StopFlag  # noqa: E402
from support.loop import ACCUM, CPU, MICRO, RUN, TINY_CLASSES, AccumBatches, fit_config, learned_accum, tiny_accum_net  # noqa: E402


def main():
    out, optimizer = sys.argv[1], sys.argv[2]
    hvd.init()
    dist = distributed.Distributed(hvd)
    import pathlib
    for name, global_batch, accum, size, count in (("micro", 2 * MICRO, ACCUM, MICRO, 2 * ACCUM),
                                                   ("large", 2 * MICRO * ACCUM, 1, MICRO * ACCUM, 2)):
        workspace = pathlib.Path(out) / f"{name}-{dist.rank}"
        workspace.mkdir(parents=True, exist_ok=True)
        cfg = fit_config(workspace, global_batch, accum, "--kv-store", "horovod", "--optimizer", optimizer)
        net = tiny_accum_net(pathlib.Path(out) / f"init-{dist.rank}.params")  # rank 0's weights are broadcast
        state = fit.prepare(cfg, RUN, net, CPU, dist)
        loop = fit.Loop(net=net, ctxs=CPU, dist=dist, stop=StopFlag(dist), guard=precision.StatsGuard(net),
                        end_epoch=cfg.num_epochs, num_classes=TINY_CLASSES)
        stats, steps, _ = fit.train_one_epoch(cfg, loop, state, AccumBatches(size, count, seed=dist.rank), 0)
        assert steps == count and stats.samples == size * count, (steps, stats.samples)
        np.savez(os.path.join(out, f"{name}-rank{dist.rank}.npz"), **learned_accum(net))
    dist.finish()


if __name__ == "__main__":
    main()
