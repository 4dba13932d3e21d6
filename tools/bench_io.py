"""Data-loading benchmark: --test-io images/s of several backends on the same RecordIO, same thread count.

    python tools/bench_io.py [--rec PATH.rec] [--backends dali-cpu,mxnet] [--threads N] [--mode train|val]
                             [--auto-augment none,randaugment,...]

Without --rec it builds a RecordIO of real photographs of ImageNet-like size (crops of scikit-learn's two
sample photos, resized to 500x375 or 375x500, JPEG quality 90) once in --workdir. Each backend runs in its own
process (so one backend's threads never compete with another's leftovers) and prints a JSON line; the table
compares them with the last backend as the reference. ``--auto-augment`` times the DALI training pipelines once
per policy listed ("none" is the plain pipeline, then the reference), so the cost of automatic augmentation is
known.

With a DALI CPU backend in a training run, each round also times the machine's ceiling: decoding alone (every
record's JPEG through OpenCV's libjpeg-turbo, one thread, bytes read beforehand), DALI's crop-window decoder alone
(the pipeline's first operator) and the DALI CPU training pipeline on one thread, each on one core (what runs beside
the thread shares it), then prints the pipeline's share of decoding alone (per core), what it adds per image after
the decoder and its scaling from one thread to --threads (against linear), for the pipeline as it feeds the CPU
(normalized in the pipeline) and as it feeds a GPU (uint8 crops copied as into pinned memory, normalized on the GPU,
which is not timed), and how many cores of the latter feed a V100 or an A100 (their published ResNet-50 training
rates). ``--dali-cpu-resize dali`` times DALI's resize instead of OpenCV's.
A benchmark, not a test: numbers depend on the machine.

``--devices N`` also times N per-device pipelines (``--kv-store device --cpu-contexts N``, as train.py builds them),
--threads shared out among them, against one pipeline with one share of the threads (up to Nx when they run at
once) and one pipeline with all of them. Every row runs on a core per thread.

``--step-thread`` times instead what the training step's thread spends per batch in the record source (DALI's
``pipe.run()`` of an external_source alone: the records read, unless read ahead, and DALI's copy of the batch), with
the records read in the call (``--dali-read-ahead 0``) and read ahead (``--read-ahead N``), ``--step-ms`` of
compute between batches; ``--cold`` empties the page cache before each (root only), as a first epoch or a
network file system would find it.

``--handover`` times what the step's thread spends per batch in DaliBatches.next() of the whole DALI CPU training
pipeline (train.py's defaults, float32 of --image-shape), the batch handed to MXNet shared (an NDArray on DALI's
memory, the default on CPU) and copied into reused NDArrays, and the uint8 crops a GPU gets copied (as into its
pinned memory; normalized on the GPU).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from rn50kit.benchmarking.photos import make_photo_rec  # noqa: E402
from rn50kit.benchmarking.pipeline_rates import ceiling_summary, devices_summary  # noqa: E402
from rn50kit.common.backends import names_with  # noqa: E402

# The rows that time the DALI CPU training pipeline as it feeds a GPU (uint8 crops, normalized on the GPU).
FOR_GPU = "dali-cpu for a GPU"


# cv2.imdecode returns a new 0.5 MB array per photo, which glibc maps and unmaps each time (page faults, zeroing:
# half the time on a 2-core machine), where a DALI decoder writes into buffers it keeps. Raising glibc's thresholds
# keeps freed arrays in the heap, so the ceiling times decoding, not the allocator (680 -> 1,240 photos/s).
DECODE_ONLY_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 26), "MALLOC_TRIM_THRESHOLD_": str(1 << 27)}


def encoded_images(rec, idx):
    """Every record's image bytes, copied out of the file."""
    import numpy as np

    from rn50kit.data import records
    record_file = records.RecordFile(rec, idx)
    return [np.array(record_file.image(i)) for i in range(len(record_file))]


def decode_only(rec, idx):
    """In a child process: images/s of decoding alone, the pipeline's ceiling. Every record's image bytes are read
    (and copied) first, then decoded with OpenCV (libjpeg-turbo) on one thread, as DALI's CPU decoder would."""
    import cv2
    cv2.setNumThreads(1)
    payloads = encoded_images(rec, idx)
    start = time.perf_counter()
    for payload in payloads:
        if cv2.imdecode(payload, cv2.IMREAD_COLOR) is None:
            raise SystemExit("bench_io.py: error: a record does not decode; run tools/check_dataset.py on " + rec)
    print(json.dumps({"images_per_sec": len(payloads) / (time.perf_counter() - start)}))


def dali_decode_only(rec, idx, batch_size):
    """In a child process: images/s of the training pipeline's first operator alone, DALI's decoder of a random
    crop window (dali.decode_crop_window, the training defaults), on one thread: what its resize and
    crop-mirror-normalize add is the rest of the pipeline's time."""
    payloads = encoded_images(rec, idx)
    from nvidia.dali import fn, pipeline_def

    import dali
    from rn50kit.config import data_flags
    batches = [payloads[i:i + batch_size] for i in range(0, len(payloads), batch_size)]
    defaults = data_flags.DataConfig()

    @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None)
    def decode():
        jpegs = fn.external_source(source=batches, cycle="quiet")
        return dali.decode_crop_window(jpegs, (defaults.min_random_area, defaults.max_random_area),
                                       (defaults.min_random_aspect_ratio, defaults.max_random_aspect_ratio))

    pipe = decode()
    pipe.build()
    for _ in batches:  # a pass to fill DALI's buffers and queues
        pipe.run()
    start = time.perf_counter()
    for _ in batches:
        pipe.run()
    print(json.dumps({"images_per_sec": len(payloads) / (time.perf_counter() - start)}))


def step_thread_ms(rec, idx, batch_size, ahead, use_mmap, cold, steps, step_ms):
    """Median ms per batch that the step's thread spends in the training record source's pipe.run(), with step_ms
    of compute (a sleep: the GIL released, as in MXNet's engine) after each; DALI's prefetch fill is skipped."""
    from nvidia.dali import fn, pipeline_def, types

    from rn50kit.config import data_flags
    from rn50kit.data import record_source, records
    if cold:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as caches:  # PermissionError unless root
            caches.write("1")
    source = record_source.ShuffledShardSource(records.RecordFile(rec, idx, use_mmap=use_mmap), 0, 1, batch_size,
                                               seed=1, ahead=ahead)
    prefetch = data_flags.DataConfig.dali_prefetch_queue  # train.py's default

    @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None, prefetch_queue_depth=prefetch)
    def source_only():
        return tuple(fn.external_source(source=source, num_outputs=2, batch=True, dtype=[types.UINT8, types.FLOAT]))

    pipe = source_only()
    pipe.build()
    times = []
    for _ in range(prefetch + steps):
        start = time.perf_counter()
        pipe.run()
        times.append(time.perf_counter() - start)
        time.sleep(step_ms / 1000)
    return 1000 * statistics.median(times[prefetch:])


def timed_rows(rows, measure, repeats, label="{}"):
    """``measure(value)`` (ms) for each of ``rows`` ({name: value}), the rows alternating within each of ``repeats``
    rounds (a load change on a shared machine hits them all); prints each row's median (name through ``label``)
    and returns ({name: median}, the rounds)."""
    rounds = [{name: measure(value) for name, value in rows.items()} for _ in range(repeats)]
    result = {name: statistics.median(r[name] for r in rounds) for name in rows}
    width = max(20, *(len(label.format(name)) for name in rows))
    for name, ms in result.items():
        print(f"{label.format(name):<{width}} {ms:8.2f} ms")
    return result, rounds


def step_thread(args, rec, idx):
    """--step-thread: the records read in the call against read ahead, alternating within each round."""
    if args.cold and os.geteuid() != 0:
        raise SystemExit("bench_io.py: error: --cold empties the page cache, which needs root; run without it")
    from rn50kit.config import data_flags
    read_ahead = data_flags.DataConfig.dali_read_ahead if args.read_ahead is None else args.read_ahead
    rows = {"read in the call": 0, f"read ahead {read_ahead}": read_ahead}
    print(f"ms per batch of {args.batch_size} on the training step's thread, records "
          f"{'read' if args.dont_use_mmap else 'mapped'} from a {'cold' if args.cold else 'warm'} page cache, "
          f"{args.step_ms:g} ms of compute between batches, medians of {args.repeats} rounds, {rec}")
    result, rounds = timed_rows(rows, lambda ahead: step_thread_ms(rec, idx, args.batch_size, ahead,
                                                                   not args.dont_use_mmap, args.cold, args.steps,
                                                                   args.step_ms), args.repeats)
    print(json.dumps({"step_thread_ms": result, "batch_size": args.batch_size, "cold": args.cold,
                      "mmap": not args.dont_use_mmap, "rounds": rounds}))


def handover_ms(rec, idx, batch_size, image_shape, threads, share, normalized, steps, step_ms):
    """Median ms per batch that the step's thread spends in DaliBatches.next() of the DALI CPU training pipeline
    (train.py's defaults, float32 of ``image_shape``, or its uint8 crops for a GPU when not ``normalized``): DALI's
    run() of a batch it has made meanwhile, then the batch handed to MXNet, shared (an NDArray on DALI's memory) or
    copied into reused NDArrays (as into pinned memory for a GPU), with step_ms of compute (a sleep) after each;
    DALI's prefetch fill is skipped."""
    import mxnet as mx

    import dali
    from rn50kit.config import data_flags
    from rn50kit.data import record_source, records
    defaults = data_flags.DataConfig()
    source = record_source.ShuffledShardSource(records.RecordFile(rec, idx), 0, 1, batch_size, seed=1,
                                      ahead=defaults.dali_read_ahead)
    pipe = dali.train_pipeline(source=source, image_shape=image_shape, mean=defaults.rgb_mean, std=defaults.rgb_std,
                               batch_size=batch_size, num_threads=threads, device_id=None, seed=1,
                               prefetch_queue_depth=defaults.dali_prefetch_queue, normalize=normalized)
    pipe.build()
    batches = dali.DaliBatches(pipe, mx.cpu(), share=share)
    times = []
    for _ in range(defaults.dali_prefetch_queue + steps):
        time.sleep(step_ms / 1000)
        start = time.perf_counter()
        images, _ = batches.next()
        times.append(time.perf_counter() - start)
        images.wait_to_read()  # as a step reads its batch before the next is drawn
    del images, batches, pipe  # the pipeline and its batches go now, before the next row's
    return 1000 * statistics.median(times[defaults.dali_prefetch_queue:])


def handover(args, rec, idx):
    """--handover: DaliBatches.next() with the batch shared with MXNet, copied, and copied as the uint8 crops a GPU
    gets (normalized there), alternating in each round."""
    rows = {"shared": (True, True), "copied": (False, True), "uint8 copied, for a GPU": (False, False)}
    shape = tuple(int(n) for n in args.image_shape.split(","))
    print(f"ms per batch of {args.batch_size} ({'x'.join(map(str, shape))}) on the training step's thread in "
          f"DaliBatches.next(), {args.threads} DALI threads, {args.step_ms:g} ms of compute between batches (more "
          f"than the pipeline needs per batch, or the wait for it is timed too), medians of {args.repeats} rounds, "
          f"{rec}")
    result, rounds = timed_rows(rows, lambda how: handover_ms(rec, idx, args.batch_size, shape, args.threads, *how,
                                                              args.steps, args.step_ms), args.repeats, "batch {}")
    print(json.dumps({"handover_ms": result, "batch_size": args.batch_size, "image_shape": shape,
                      "threads": args.threads, "step_ms": args.step_ms, "rounds": rounds}))


def run_one(argv, for_gpu=False):
    """In a child process: build one backend's iterators and time them (train.py's parser, io_timing.test_io).
    ``for_gpu``: time the CPU's part of feeding a GPU, the DALI pipeline's uint8 crops copied into reused host
    arrays (as DaliBatches copies them into pinned memory); their copy to the GPU and normalization there, GPU work,
    are left out (no GPU here)."""
    import train
    from rn50kit.config import train_config
    from rn50kit.data import io_timing, loaders
    from rn50kit.training import worker
    args = train.parse_args(argv + ["--dali-normalize", "device"] if for_gpu else argv)
    cfg = train_config.from_args(args)
    # --kv-store device --cpu-contexts N: a pipeline per context, as train.py builds them
    train_iter, val_iter = loaders.get_data_iterators_per_device(cfg, 0, 1, 0, 1, worker.contexts(cfg.fit, 0, 1, 0))
    if for_gpu:
        for iterator in (train_iter, val_iter):
            for part in getattr(iterator, "iterators", [iterator]) if iterator is not None else []:
                part.batches.normalize, part.batches.share = None, False
    result = io_timing.test_io(cfg, train_iter, val_iter, epochs=args.num_epochs, out=lambda line: None)
    print(json.dumps(dict(result, backend=args.data_backend, auto_augment=args.auto_augment)))


def add_data_args(parser):
    """The RecordIO timed: given, or a photo set built once."""
    group = parser.add_argument_group("Data")
    group.add_argument("--rec", help="RecordIO to read (default: build a photo set in --workdir)")
    group.add_argument("--workdir", default="data/bench_io", help="where the photo set is built")
    group.add_argument("--count", type=int, default=1024, help="images in the built photo set")
    return group


def add_sweep_args(parser):
    """The rows compared and how each is run and repeated."""
    group = parser.add_argument_group("Sweep")
    group.add_argument("--backends", default="dali-cpu,mxnet", help="comma-separated backends to compare")
    group.add_argument("--threads", type=int, default=os.cpu_count(), help="decoding threads, every backend")
    group.add_argument("--batch-size", type=int, default=64)
    group.add_argument("--image-shape", default="3,224,224")
    group.add_argument("--mode", default="train", choices=["train", "val"], help="pipeline to time")
    group.add_argument("--epochs", type=int, default=2, help="passes over the data per backend and round")
    group.add_argument("--repeats", type=int, default=3, help="rounds; medians are reported")
    group.add_argument("--devices", type=int, default=1,
                       help="also time this many per-device pipelines (--kv-store device), --threads shared out "
                            "among them, against one pipeline with a share's threads: do they run at once?")
    group.add_argument("--dali-cpu-resize", choices=["opencv", "dali"],
                       help="what resizes the DALI CPU training crops (default: train.py's)")
    group.add_argument("--auto-augment", default="none",
                       help="comma-separated policies the DALI training pipelines are timed with (none, autoaugment, "
                            "randaugment, trivialaugment); the other backends run without")
    group.add_argument("--no-ceiling", action="store_true",
                       help="skip the decode-only ceiling and one-thread pipeline runs (training mode, dali-cpu)")
    return group


def add_step_thread_args(parser, batches_ahead):
    """--step-thread and --handover: the training step's thread timed instead of the pipeline's rate."""
    group = parser.add_argument_group("Step thread and handover")
    group.add_argument("--step-thread", action="store_true",
                       help="time the training step's thread in the record source instead (read in the call vs "
                            "read ahead)")
    group.add_argument("--read-ahead", type=batches_ahead,
                       help="--step-thread: batches read ahead (default: train.py's --dali-read-ahead)")
    group.add_argument("--steps", type=int, default=15, help="--step-thread, --handover: batches timed per round")
    group.add_argument("--step-ms", type=float, default=100,
                       help="--step-thread, --handover: compute per step, in ms")
    group.add_argument("--cold", action="store_true", help="--step-thread: empty the page cache first (root)")
    group.add_argument("--handover", action="store_true",
                       help="time instead what the step's thread spends per batch in DaliBatches.next() of the "
                            "training pipeline, the batch shared with MXNet (the default on CPU) vs copied, and "
                            "copied as the uint8 crops a GPU gets (--steps, --step-ms: give more ms than the "
                            "pipeline needs per batch)")
    group.add_argument("--dont-use-mmap", action="store_true", help="--step-thread: plain reads, not mmap")
    return group


def add_child_args(parser):
    """The hidden entries of the child processes that time one row each."""
    parser.add_argument("--one", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.add_argument("--one-for-gpu", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.add_argument("--decode-only", nargs=2, metavar=("REC", "IDX"), help=argparse.SUPPRESS)
    parser.add_argument("--dali-decode-only", nargs=2, metavar=("REC", "IDX"), help=argparse.SUPPRESS)


def get_args_parser():
    from rn50kit.common.helptext import HelpFormatter
    from rn50kit.config import cli
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    add_data_args(parser)
    add_sweep_args(parser)
    add_step_thread_args(parser, cli.batches_ahead)
    add_child_args(parser)
    return parser


def fail(status, message):
    """As argparse's parser.exit: the message on stderr, then the status."""
    sys.stderr.write(message)
    sys.exit(status)


def record_file(args):
    """The .rec to time: --rec, checked, or the photo set of --count images in --workdir, built the first time."""
    if args.rec:
        if not os.path.isfile(args.rec) or not os.path.isfile(os.path.splitext(args.rec)[0] + ".idx"):
            fail(2, f"bench_io.py: error: --rec {args.rec} or its .idx does not exist\n")
        return args.rec
    os.makedirs(args.workdir, exist_ok=True)
    rec = os.path.join(args.workdir, f"photos{args.count}.rec")
    if not os.path.isfile(rec):
        print(f"building {args.count} photos of 500x375 in {rec}", file=sys.stderr)
        make_photo_rec(rec[:-4], args.count)
    return rec


# A row of the comparison: (row name, backend, policy, threads, devices); the ceiling's decoders have no backend.
def backend_rows(args, policies):
    """A DALI training pipeline once per policy, everything else once."""
    return [(backend if policy == "none" else f"{backend}+{policy}", backend, policy, args.threads, 1)
            for backend in args.backends.split(",")
            for policy in (policies if backend in names_with("auto_augment") and args.mode == "train" else ["none"])]


def ceiling_rows(threads):
    """The ceiling: decoding alone and the plain DALI CPU pipeline on one thread, for the CPU and for a GPU (the
    plain DALI CPU training pipeline must be one of the backend rows: it is the ceiling's multi-thread figure)."""
    rows = [("decode-only", None, "none", 1, 1), ("dali decode-only", None, "none", 1, 1),
            (FOR_GPU, "dali-cpu", "none", threads, 1)]
    if threads > 1:
        rows += [("dali-cpu 1 thread", "dali-cpu", "none", 1, 1), (FOR_GPU + " 1 thread", "dali-cpu", "none", 1, 1)]
    return rows


def device_row_names(threads, devices):
    """(the per-device pipelines' row, the row of one pipeline with the threads each of them has)."""
    share = threads // devices
    return f"dali-cpu {devices} devices", f"dali-cpu {share} thread" + "s" * (share > 1)


def device_rows(args, rows):
    """Per-device pipelines (--kv-store device) against one pipeline with the threads each of them has (unless
    ``rows`` has it already)."""
    share = args.threads // args.devices
    per_device, one_of_share = device_row_names(args.threads, args.devices)
    added = [(per_device, "dali-cpu", "none", share, args.devices)]
    if one_of_share not in [name for name, *_ in rows]:
        added.append((one_of_share, "dali-cpu", "none", share, 1))
    return added


def child_command(args, rec, idx, name, backend, policy, threads, devices):
    """(command, environment) of the child process that times one row."""
    if name == "decode-only":
        return ([sys.executable, __file__, "--decode-only", rec, idx],
                dict(os.environ, OMP_NUM_THREADS="1", **DECODE_ONLY_ENV))
    if name == "dali decode-only":
        return ([sys.executable, __file__, "--dali-decode-only", rec, idx, "--batch-size", str(args.batch_size)],
                dict(os.environ, OMP_NUM_THREADS="1"))
    argv = ["--data-backend", backend, f"--data-{args.mode}", rec, f"--data-{args.mode}-idx", idx,
            "--batch-size", str(args.batch_size), "--image-shape", args.image_shape, "--test-io",
            "--test-io-mode", args.mode, "--num-epochs", str(args.epochs), "--dali-threads", str(threads),
            "--dali-validation-threads", str(threads), "--data-mxnet-threads", str(threads), "--seed", "1",
            "--auto-augment", policy, "--randaugment-m", "18"]
    if args.dali_cpu_resize:
        argv += ["--dali-cpu-resize", args.dali_cpu_resize]
    if devices > 1:
        argv += ["--kv-store", "device", "--cpu-contexts", str(devices)]
    command = [sys.executable, __file__, "--one-for-gpu" if name.startswith(FOR_GPU) else "--one", *argv]
    return command, dict(os.environ, OMP_NUM_THREADS=str(threads * devices))


def images_per_sec(args, rec, idx, row):
    """One row's images/s, timed in a child process on a core per thread."""
    name, _, _, threads, devices = row
    command, env = child_command(args, rec, idx, *row)
    # A core per thread (the first ones): DALI's executor, the step's thread and the resize share them, so a
    # one-thread rate is a rate per core, as the ceiling's share and scaling need.
    cores = set(sorted(os.sched_getaffinity(0))[:threads * devices])
    child = subprocess.run(command, env=env, capture_output=True, text=True,
                           preexec_fn=lambda: os.sched_setaffinity(0, cores))
    if child.returncode:
        fail(1, f"bench_io.py: error: {name} failed:\n{child.stderr[-2000:]}\n")
    return json.loads(child.stdout.strip().splitlines()[-1])["images_per_sec"]


def reference_row(rows, backends, policies):
    """The row the ratios are against: the last backend ("dali-cpu 1.63x" reads as in the README: DALI's speed over
    MXNet's), or, for the cost of automatic augmentation, the plain DALI pipeline."""
    reference = backends[-1]
    if len(policies) > 1:
        reference = next((name for name, backend, policy, *_ in rows if backend in names_with("auto_augment")
                          and policy == "none"), reference)
    return reference


def print_table(args, rec, backends, rounds, reference):
    """The table of the backend rows (median images/s, median ratio to ``reference``); returns its results."""
    print(f"{args.mode} pipeline, {args.threads} threads, batch {args.batch_size}, {args.repeats} rounds, {rec}")
    width = max(10, *(len(name) for name in backends))
    print(f"{'backend':<{width}} {'images/s (median)':>18} {'ratio to ' + reference + ' (median of rounds)':>36}")
    summary = {}
    for backend in backends:
        rate = statistics.median(r[backend] for r in rounds)
        ratio = statistics.median(r[backend] / r[reference] for r in rounds)
        summary[backend] = {"images_per_sec": rate, "ratio": ratio, "rounds": [r[backend] for r in rounds]}
        print(f"{backend:<{width}} {rate:>18.1f} {ratio:>35.2f}x")
    return summary


def median_of(rounds, name):
    return statistics.median(r[name] for r in rounds)


def one_and_all(rounds, name, threads):
    """(one thread's, all threads') median images/s of a pipeline (the same row when --threads 1)."""
    return (median_of(rounds, f"{name} 1 thread") if threads > 1 else median_of(rounds, name)), median_of(rounds, name)


def compare_backends(args, rec, idx):
    """The backends' rows (and the ceiling's and per-device rows) alternating within each round, the table, the
    summaries and the JSON line."""
    policies = args.auto_augment.split(",")
    rows = backend_rows(args, policies)
    backends = [name for name, *_ in rows]
    ceiling = args.mode == "train" and "dali-cpu" in backends and not args.no_ceiling
    if ceiling:
        rows += ceiling_rows(args.threads)
    if args.devices > 1:
        rows += device_rows(args, rows)
    # backends alternate within each round, so a load change on a shared machine hits all of them
    rounds = [{row[0]: images_per_sec(args, rec, idx, row) for row in rows} for _ in range(args.repeats)]
    reference = reference_row(rows, backends, policies)
    report = {"mode": args.mode, "threads": args.threads,
              "results": print_table(args, rec, backends, rounds, reference)}
    cores = len(os.sched_getaffinity(0))
    if ceiling:
        lines, report["ceiling"] = ceiling_summary(
            median_of(rounds, "decode-only"), median_of(rounds, "dali decode-only"),
            one_and_all(rounds, "dali-cpu", args.threads), one_and_all(rounds, FOR_GPU, args.threads), args.threads,
            cores)
        print("\n".join(lines))
    if args.devices > 1:
        per_device, one_of_share = device_row_names(args.threads, args.devices)
        line, report["devices"] = devices_summary(
            args.devices, args.threads // args.devices, median_of(rounds, per_device), median_of(rounds, one_of_share),
            median_of(rounds, "dali-cpu") if "dali-cpu" in backends else None, cores)
        print(line)
    print(json.dumps(report))


def main():
    parser = get_args_parser()
    args = parser.parse_args()
    # a child process: one row's timing
    if args.one is not None or args.one_for_gpu is not None:
        return run_one(args.one if args.one is not None else args.one_for_gpu, for_gpu=args.one is None)
    if args.decode_only is not None:
        return decode_only(*args.decode_only)
    if args.dali_decode_only is not None:
        return dali_decode_only(*args.dali_decode_only, args.batch_size)
    # the driver
    if not args.step_thread and (args.devices < 1 or args.threads % args.devices):
        parser.exit(2, f"bench_io.py: error: --devices {args.devices}: give a divisor of --threads {args.threads} "
                       f"(each device's pipeline gets the same share of the threads)\n")
    rec = record_file(args)
    idx = os.path.splitext(rec)[0] + ".idx"
    if args.step_thread:
        return step_thread(args, rec, idx)
    if args.handover:
        return handover(args, rec, idx)
    return compare_backends(args, rec, idx)


if __name__ == "__main__":
    main()
