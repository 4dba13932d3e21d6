"""Start-up benchmark: what a training start costs as the data set grows, on record sets shaped like ImageNet's.

    python tools/bench_startup.py [--sizes 10000,100000,1281167] [--backends dali-cpu,mxnet] [--workdir DIR]
                                  [--spacing BYTES] [--no-train]

For each size it builds (once, in --workdir) train.rec/.idx/.lst: tiny JPEGs (16x16) with 1,000 classes in a
shuffled order, one record every --spacing bytes (default 110 KiB, ImageNet's mean record) as a sparse file, so
the file is ImageNet's length (141 GB at 1.28 million records) on a few GB of disk. With the mxnet backend among
--backends each record fills its spacing (the image, then a hole: build's ``padded``), as ImageRecordIter needs;
both backends are then measured on the same files. Then, with train.rec evicted from the page cache
(posix_fadvise DONTNEED) before each measurement, it prints per size and backend:

- startup_s: what grows with N, timed in a fresh process: the index check (records.RecordFile), the label checks
  train.py makes (label_problem, record_labels, class_count_problem with the .lst), the class names (the .lst) and
  first_batch_s: for dali-cpu the first batch of the training record source (the whole-file permutation of its
  order), for mxnet the backend's iterators (ImageRecordIter, which reads the .idx itself) and their first batch;
  startup_cpu_s, the CPU time of them all (on a loaded machine the wall time is a multiple of it);
- rec_cached_mb: the MB of train.rec in the page cache after that (mincore through a map of the file, no page
  touched);
- train_s, train_rec_cached_mb, train_peak_mb (with --no-train: skipped): `train.py` (the backend on one thread,
  ResNet-18 at 32x32, batch 8, --benchmark-iters 2 --num-epochs 1) from launch to exit, the MB of train.rec then
  in the page cache, and the peak resident memory of its process;
- at the end, per backend, the growth per record of startup_s between the smallest and largest size.

A benchmark, not a test: figures depend on the machine (docs/performance.md has this machine's).
"""
import argparse
import ctypes
import json
import mmap
import os
import resource
import subprocess
import sys
import time

KIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, KIT_DIR)

import numpy as np  # noqa: E402

from rn50kit.data import records  # noqa: E402

CLASSES = 1000
SPACING = 110 * 1024  # ImageNet's train.rec: about 140 GB for 1,281,167 records


def tiny_jpegs(count=16):
    import cv2
    rng = np.random.default_rng(0)
    return [cv2.imencode(".jpg", rng.integers(0, 255, (16, 16, 3), dtype=np.uint8))[1].tobytes() for _ in range(count)]


def build(folder, total, spacing=SPACING, seed=0, padded=False):
    """train.rec (sparse: one record every ``spacing`` bytes), train.idx and im2rec's train.lst in ``folder``.
    ``padded``: each record fills its ``spacing`` (its image followed by a hole of zeros, which JPEG decoders
    ignore after the image's end marker), as ImageRecordIter's indexed reader needs: it reads a record's whole
    extent, up to the next one, and aborts the process on anything there that is not a record."""
    done = os.path.join(folder, "built.json")
    if os.path.isfile(done) and json.load(open(done)) == {"records": total, "spacing": spacing, "padded": padded}:
        return os.path.join(folder, "train.rec")
    os.makedirs(folder, exist_ok=True)
    images = tiny_jpegs()
    labels = np.random.default_rng(seed).integers(0, CLASSES, total)
    with open(os.path.join(folder, "train.rec"), "wb") as rec, open(os.path.join(folder, "train.idx"), "w") as idx, \
            open(os.path.join(folder, "train.lst"), "w") as lst:
        for i, label in enumerate(labels.tolist()):
            rec.seek(i * spacing)
            payload = records.IR_HEADER.pack(0, label, i, 0) + images[i % len(images)]
            if padded:  # the record's header says spacing - 8 bytes; only the image is written: the rest is a hole
                assert len(records.encode_record(payload)) == 8 + len(payload) + -len(payload) % 4  # in one part
                rec.write(records.MAGIC_BYTES + (spacing - 8).to_bytes(4, "little") + payload)
            else:
                rec.write(records.encode_record(payload))
            idx.write(f"{i}\t{i * spacing}\n")
            lst.write(f"{i}\t{label}\tn{label:08d}/n{label:08d}_{i}.JPEG\n")
        rec.truncate(total * spacing)  # ImageNet's length: the last record's gap too
    json.dump({"records": total, "spacing": spacing, "padded": padded}, open(done, "w"))
    return os.path.join(folder, "train.rec")


def evict(path):
    """Drop ``path``'s clean pages from the page cache."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(descriptor)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)


def cached_bytes(path, window=1 << 30):
    """Bytes of ``path`` in the page cache: mincore(2) over a read-only map of the file, a window at a time (the
    map touches no page)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size, page = os.path.getsize(path), mmap.PAGESIZE
    resident = 0
    descriptor = os.open(path, os.O_RDONLY)
    try:
        for start in range(0, size, window):
            length = min(window, size - start)
            address = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, descriptor, start)
            if address in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), "mmap failed")
            try:
                pages = (ctypes.c_ubyte * ((length + page - 1) // page))()
                if libc.mincore(ctypes.c_void_p(address), length, pages):
                    raise OSError(ctypes.get_errno(), "mincore failed")
                resident += int(np.count_nonzero(np.frombuffer(pages, dtype=np.uint8) & 1)) * page
            finally:
                libc.munmap(ctypes.c_void_p(address), length)
    finally:
        os.close(descriptor)
    return min(resident, size)


def first_batch(record_file, backend):
    """The first batch of ``backend``'s training reader: dali-cpu's record source (what of the DALI pipeline grows
    with the data set), or the mxnet backend's iterators, built and drawn from."""
    if backend == "dali-cpu":
        from rn50kit.data import record_source
        return record_source.ShuffledShardSource(record_file, 0, 1, 8, seed=0, num_classes=CLASSES)()
    import mxnet as mx

    from rn50kit.common import backends
    from rn50kit.config.data_flags import DataConfig
    from rn50kit.data import protocol
    cfg = DataConfig(data_backend=backend, data_train=record_file.rec_path, data_train_idx=record_file.idx_path,
                     image_shape=(3, 32, 32), data_mxnet_threads=1)
    train_iter, _ = backends.builder(backend)(cfg, protocol.Feed(batch_size=8, seed=0, num_classes=CLASSES),
                                                    0, 1, 0, 1, mx.cpu())
    return next(iter(train_iter)).data[0].wait_to_read()


def probe(rec, backend):
    """In this (fresh) process: seconds of each start-up step that reads the data set; prints a JSON line."""
    from rn50kit.data.record_files import class_count_problem
    from rn50kit.scoring import predict
    idx = os.path.splitext(rec)[0] + ".idx"
    times, start, cpu = {}, time.perf_counter(), time.process_time()

    def lap(name):
        nonlocal start
        now = time.perf_counter()
        times[name] = round(now - start, 3)
        start = now
    record_file = records.RecordFile(rec, idx)
    lap("index_check_s")
    labels = record_file.labels[np.isfinite(record_file.labels)]
    class_count_problem(rec, None, CLASSES, np.unique(labels).astype(int).tolist())
    lap("class_count_s")
    predict.dataset_class_names(rec)
    lap("class_names_s")
    first_batch(record_file, backend)
    lap("first_batch_s")
    times["startup_s"] = round(sum(times.values()), 3)
    times["startup_cpu_s"] = round(time.process_time() - cpu, 3)  # what a shared machine's load does not inflate
    times["probe_peak_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(times))


def run_train(rec, workspace, backend="dali-cpu"):
    """train.py's 2-iteration start from launch to exit: (seconds, peak resident MB of its processes)."""
    from rn50kit.common import backends
    threads = "--" + (backends.get(backend).flag_prefix + "threads").replace("_", "-")  # its own threads flag
    command = [sys.executable, os.path.join(KIT_DIR, "train.py"), "--data-backend", backend, threads, "1",
               "--data-train", rec, "--data-train-idx", os.path.splitext(rec)[0] + ".idx", "--num-layers", "18",
               "--num-classes", str(CLASSES), "--image-shape", "3,32,32", "--batch-size", "8",
               "--benchmark-iters", "2", "--num-epochs", "1", "--workspace", workspace]
    wrapper = ("import resource, subprocess, sys, time; t = time.time(); code = subprocess.call(sys.argv[1:], "
               "stdout=subprocess.DEVNULL); print(time.time() - t, resource.getrusage(resource.RUSAGE_CHILDREN)"
               ".ru_maxrss, code)")
    out = subprocess.run([sys.executable, "-c", wrapper, *command], capture_output=True, text=True, check=True)
    seconds, peak_kb, code = out.stdout.split()
    if int(code):
        raise SystemExit(f"bench_startup.py: train.py failed (status {code}): {out.stderr.strip()[-2000:]}")
    return float(seconds), int(peak_kb) / 1024


def measure(rec, train=True, backend="dali-cpu"):
    row = {"backend": backend, "records": len(records.read_index_arrays(os.path.splitext(rec)[0] + ".idx")[0]),
           "rec_gb": round(os.path.getsize(rec) / 1e9, 1)}
    evict(rec)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe", rec, "--backend", backend],
                         capture_output=True, text=True, check=True)
    row.update(json.loads(out.stdout.strip().splitlines()[-1]))
    row["rec_cached_mb"] = round(cached_bytes(rec) / 1e6, 1)
    if train:
        evict(rec)
        row["train_s"], peak = run_train(rec, os.path.join(os.path.dirname(rec), "run-" + backend), backend)
        row["train_rec_cached_mb"] = round(cached_bytes(rec) / 1e6, 1)
        row["train_peak_mb"] = round(peak, 1)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1281167", help="record counts, comma-separated")
    parser.add_argument("--workdir", default=os.path.join(KIT_DIR, "runs", "bench_startup"),
                        help="where the record sets are built (kept for the next run)")
    parser.add_argument("--spacing", type=int, default=SPACING, help="bytes from one record to the next")
    parser.add_argument("--backends", default="dali-cpu,mxnet", type=lambda text: text.split(","),
                        help="the data backends measured, comma-separated (dali-cpu, mxnet)")
    parser.add_argument("--no-train", action="store_true", help="time the start-up steps only, not train.py")
    parser.add_argument("--probe", metavar="REC", help=argparse.SUPPRESS)  # the fresh process of one measurement
    parser.add_argument("--backend", default="dali-cpu", help=argparse.SUPPRESS)  # the probe's
    args = parser.parse_args(argv)
    if args.probe:
        return probe(args.probe, args.backend)
    unknown = sorted(set(args.backends) - {"dali-cpu", "mxnet"})
    if unknown:
        parser.error(f"--backends takes dali-cpu and mxnet, not {', '.join(unknown)}")
    padded = "mxnet" in args.backends
    rows = []
    for total in (int(size) for size in args.sizes.split(",")):
        started = time.time()
        rec = build(os.path.join(args.workdir, f"{total}-padded" if padded else str(total)), total, args.spacing,
                    padded=padded)
        print(f"bench_startup: {total} records ready in {time.time() - started:.0f} s", file=sys.stderr)
        for backend in args.backends:
            rows.append(measure(rec, not args.no_train, backend))
            print(json.dumps(rows[-1]), flush=True)
    for backend in args.backends:
        print_growth([row for row in rows if row["backend"] == backend])
    return 0


def print_growth(rows):
    """The growth per record of the start-up between the smallest and the largest size measured."""
    if len(rows) < 2:
        return
    first, last = rows[0], rows[-1]
    for key in ("startup_s", "startup_cpu_s"):
        per_record = (last[key] - first[key]) / (last["records"] - first["records"])
        print(f"{first['backend']}: growth of {key}: {per_record * 1e6:.2f} us per record ({per_record * 1281167:.1f} "
              f"s at ImageNet's 1,281,167)")


if __name__ == "__main__":
    sys.exit(main())
