"""Data-loading benchmark: --test-io images/s of several backends on the same RecordIO, same thread count.

    python tools/bench_io.py [--rec PATH.rec] [--backends dali-cpu,mxnet] [--threads N] [--mode train|val]
                             [--auto-augment none,randaugment,...]

Without --rec it builds a RecordIO of real photographs of ImageNet-like size (crops of scikit-learn's two
sample photos, resized to 500x375 or 375x500, JPEG quality 90) once in --workdir. Each backend runs in its own
process (so one backend's threads never compete with another's leftovers) and prints a JSON line; the table
compares them with the last backend as the reference. ``--auto-augment`` times the DALI training pipelines once
per policy listed ("none" is the plain pipeline, then the reference), so the cost of automatic augmentation is
known. A benchmark, not a test: numbers depend on the machine.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def make_photo_rec(prefix, count, seed=0):
    import cv2
    import numpy as np
    import sklearn.datasets
    from mxnet import recordio
    folder = os.path.join(os.path.dirname(sklearn.datasets.__file__), "images")
    photos = [cv2.imread(os.path.join(folder, name)) for name in ("china.jpg", "flower.jpg")]
    rng = np.random.RandomState(seed)
    writer = recordio.MXIndexedRecordIO(prefix + ".idx.tmp", prefix + ".rec.tmp", "w")
    for i in range(count):
        photo = photos[i % 2]
        h, w = rng.randint(250, 427), rng.randint(300, 640)
        y, x = rng.randint(0, 428 - h), rng.randint(0, 641 - w)
        size = (500, 375) if rng.rand() < 0.75 else (375, 500)  # mostly landscape, like ImageNet
        image = cv2.resize(photo[y:y + h, x:x + w], size, interpolation=cv2.INTER_AREA)
        if rng.rand() < 0.5:
            image = image[:, ::-1]
        jpeg = cv2.imencode(".jpg", np.ascontiguousarray(image), [cv2.IMWRITE_JPEG_QUALITY, 90])[1]
        writer.write_idx(i, recordio.pack(recordio.IRHeader(0, float(i % 10), i, 0), jpeg.tobytes()))
    writer.close()
    os.replace(prefix + ".rec.tmp", prefix + ".rec")
    os.replace(prefix + ".idx.tmp", prefix + ".idx")


def run_one(argv):
    """In a child process: build one backend's iterators and time them (train.py's parser, data.test_io)."""
    sys.path.insert(0, ROOT)
    import mxnet as mx
    import config
    import data
    import train
    args = train.parse_args(argv)
    cfg = config.from_args(args)
    train_iter, val_iter = data.get_data_iterators(cfg, 0, 1, 0, 1, mx.cpu())
    result = data.test_io(cfg, train_iter, val_iter, epochs=args.num_epochs, out=lambda line: None)
    print(json.dumps(dict(result, backend=args.data_backend, auto_augment=args.auto_augment)))


def main():
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # helptext
    from helptext import HelpFormatter
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument("--rec", help="RecordIO to read (default: build a photo set in --workdir)")
    parser.add_argument("--workdir", default="data/bench_io", help="where the photo set is built")
    parser.add_argument("--count", type=int, default=1024, help="images in the built photo set")
    parser.add_argument("--backends", default="dali-cpu,mxnet", help="comma-separated backends to compare")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="decoding threads, every backend")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-shape", default="3,224,224")
    parser.add_argument("--mode", default="train", choices=["train", "val"], help="pipeline to time")
    parser.add_argument("--epochs", type=int, default=2, help="passes over the data per backend and round")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument("--auto-augment", default="none",
                        help="comma-separated policies the DALI training pipelines are timed with (none, autoaugment, "
                             "randaugment, trivialaugment); the other backends run without")
    parser.add_argument("--one", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        return run_one(args.one)
    if args.rec:
        rec = args.rec
        if not os.path.isfile(rec) or not os.path.isfile(os.path.splitext(rec)[0] + ".idx"):
            parser.exit(2, f"bench_io.py: error: --rec {rec} or its .idx does not exist\n")
    else:
        os.makedirs(args.workdir, exist_ok=True)
        rec = os.path.join(args.workdir, f"photos{args.count}.rec")
        if not os.path.isfile(rec):
            print(f"building {args.count} photos of 500x375 in {rec}", file=sys.stderr)
            make_photo_rec(rec[:-4], args.count)
    idx = os.path.splitext(rec)[0] + ".idx"
    policies = args.auto_augment.split(",")
    # (row name, backend, policy): a DALI training pipeline once per policy, everything else once
    configs = [(backend if policy == "none" else f"{backend}+{policy}", backend, policy)
               for backend in args.backends.split(",")
               for policy in (policies if backend.startswith("dali") and args.mode == "train" else ["none"])]
    backends = [name for name, _, _ in configs]
    rounds = []  # backends alternate within each round, so a load change on a shared machine hits all of them
    for _ in range(args.repeats):
        rounds.append({})
        for name, backend, policy in configs:
            threads = str(args.threads)
            argv = ["--data-backend", backend, f"--data-{args.mode}", rec, f"--data-{args.mode}-idx", idx,
                    "--batch-size", str(args.batch_size), "--image-shape", args.image_shape, "--test-io",
                    "--test-io-mode", args.mode, "--num-epochs", str(args.epochs), "--dali-threads", threads,
                    "--dali-validation-threads", threads, "--data-mxnet-threads", threads, "--seed", "1",
                    "--auto-augment", policy, "--randaugment-m", "18"]
            env = dict(os.environ, OMP_NUM_THREADS=threads)
            child = subprocess.run([sys.executable, __file__, "--one", *argv], env=env, capture_output=True,
                                   text=True)
            if child.returncode:
                parser.exit(1, f"bench_io.py: error: {name} failed:\n{child.stderr[-2000:]}\n")
            rounds[-1][name] = json.loads(child.stdout.strip().splitlines()[-1])["images_per_sec"]
    reference = backends[-1]  # "dali-cpu 1.63x" reads as in the README: DALI's speed over MXNet's
    if len(policies) > 1:  # the cost of automatic augmentation: against the plain pipeline
        reference = next((name for name, backend, policy in configs if backend.startswith("dali")
                          and policy == "none"), reference)
    print(f"{args.mode} pipeline, {args.threads} threads, batch {args.batch_size}, {args.repeats} rounds, {rec}")
    width = max(10, *(len(name) for name in backends))
    print(f"{'backend':<{width}} {'images/s (median)':>18} {'ratio to ' + reference + ' (median of rounds)':>36}")
    summary = {}
    for backend in backends:
        rate = statistics.median(r[backend] for r in rounds)
        ratio = statistics.median(r[backend] / r[reference] for r in rounds)
        summary[backend] = {"images_per_sec": rate, "ratio": ratio, "rounds": [r[backend] for r in rounds]}
        print(f"{backend:<{width}} {rate:>18.1f} {ratio:>35.2f}x")
    print(json.dumps({"mode": args.mode, "threads": args.threads, "results": summary}))

if __name__ == "__main__":
    main()
