"""Horovod overhead on this CPU: -n 2 workers with one thread each against -n 1 with two threads, same global batch.

    python tools/horovod_overhead.py [-b GLOBAL_BATCH] [-i ITERS] [-e EPOCHS] [train.py flags]

Both runs go through runner (which gives each worker cores/N OpenMP threads) on the synthetic backend;
prints and returns the ratio ips(-n 2) / ips(-n 1). 1.0 means Horovod's allreduce costs nothing; target >= 0.9.
"""
import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from rn50kit.benchmarking.results import summarize  # noqa: E402  (the repository root is on the path only now)
from rn50kit.benchmarking.runs import run_one  # noqa: E402


def main():
    from rn50kit.common.helptext import HelpFormatter
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument("-b", "--global-batch", type=int, default=64, help="images per step over all workers")
    parser.add_argument("-i", "--iters", type=int, default=10, help="iterations per epoch")
    parser.add_argument("-e", "--epochs", type=int, default=3, help="epochs; the first is warm-up")
    args, extra = parser.parse_known_args()
    # ImageNet-size images: at 64 px a step is so short that the fixed costs (allreduce, the update every
    # worker repeats) dominate, which says little about real training.
    extra = extra or ["--num-layers", "18", "--image-shape", "3,224,224", "--num-classes", "1000"]
    runner = os.path.join(os.path.dirname(HERE), "runner")
    ips = {}
    with tempfile.TemporaryDirectory() as scratch:
        for workers in (1, 2):
            report = os.path.join(scratch, f"{workers}.json")
            command = [runner, "-n", str(workers), "-b", str(args.global_batch // workers), "-e", str(args.epochs),
                       "--mode", "train", "--data-backend", "synthetic", "--dtype", "float32",
                       "--benchmark-iters", str(args.iters), "--no-metrics", "--num-examples",
                       str(args.iters * args.global_batch), "--report", report,
                       "--workspace", os.path.join(scratch, f"run{workers}"), *extra]  # fresh: no resume
            reason = run_one(command, None)
            if reason:
                sys.exit(f"horovod_overhead: error: -n {workers} failed: {reason}")
            with open(report) as f:
                cell = summarize(json.load(f), ["train.total_ips"], args.epochs, 1)
            ips[workers] = cell["train.total_ips"]
    ratio = ips[2] / ips[1]
    print(json.dumps({"ips_n1_2threads": ips[1], "ips_n2_1thread": ips[2], "ratio": ratio}))
    print(f"Horovod overhead: -n 2 x 1 thread {ips[2]:.1f} img/s, -n 1 x 2 threads {ips[1]:.1f} img/s, "
          f"ratio {ratio:.3f} (target >= 0.9)")
    return ratio


if __name__ == "__main__":
    main()
