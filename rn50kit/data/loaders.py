"""The data flags (DALI's too), the backends' iterators, the backend dispatch and --test-io.

dali.py (the DALI pipelines) is imported only when a DALI backend is chosen: DALI is a large import, and the
mxnet and synthetic backends do not need it installed.
"""
import collections
import concurrent.futures
import dataclasses
import logging
import math
import os
import queue
import threading
import time

import mxnet as mx
import numpy as np

from rn50kit.common import backends
from rn50kit.common import cli
from rn50kit.launch import devices
from rn50kit.data import records

log = logging.getLogger(__name__)


class DataError(Exception):
    """Data that cannot be trained on (a bad record file, a record that does not decode): reported as one line."""


def int_list(text):
    return [int(x) for x in text.split(",")]


def float_list(text):
    return [float(x) for x in text.split(",")]


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The data, augmentation and DALI flags' values (their defaults are these)."""
    data_root: str = None
    data_train: str = None
    data_train_idx: str = ""
    data_val: str = None
    data_val_idx: str = ""
    data_backend: str = None  # settings.machine_defaults: dali-gpu with a GPU, dali-cpu without
    image_shape: tuple = (3, 224, 224)
    rgb_mean: tuple = (123.68, 116.779, 103.939)
    rgb_std: tuple = (58.393, 57.12, 57.375)
    input_layout: str = "NCHW"
    num_examples: int = None
    data_val_resize: int = 256
    data_mxnet_threads: int = None
    test_io: bool = False
    test_io_mode: str = "train"
    test_io_grid: str = None
    # augmentation
    min_random_area: float = 0.08
    max_random_area: float = 1.0
    min_random_aspect_ratio: float = 0.75
    max_random_aspect_ratio: float = 4 / 3
    random_mirror: int = 1
    # automatic augmentation and colour jitter (the DALI backends; rules.augment_problem refuses the others)
    auto_augment: str = "none"
    randaugment_n: int = 2
    randaugment_m: int = 9
    color_jitter: tuple = (0.0,)
    # training resolution (validation stays at --image-shape): fixed, or progressive over epochs
    train_size: tuple = ()
    train_size_epochs: tuple = ()
    train_size_step: int = 32
    # DALI
    dali_separ_val: bool = False
    dali_threads: int = None
    dali_validation_threads: int = None
    dali_prefetch_queue: int = 5
    dali_read_ahead: int = 2
    dali_nvjpeg_memory_padding: int = 64
    dali_fuse_decoder: int = 1
    dali_cpu_resize: str = "opencv"
    dali_normalize: str = "auto"
    dali_dont_use_mmap: bool = False


@dataclasses.dataclass(frozen=True)
class Feed:
    """What the pipelines need from the other concerns: the global batch, the network's input dtype, the seed
    and (synthetic data) the number of classes."""
    batch_size: int
    dtype: str = "float32"
    seed: int = None
    num_classes: int = 1000
    # An elastic run's epoch (training.elastic): the records of the permutation already read, and the steps left
    start: int = None
    steps: int = None


def add_data_args(parser):
    group = parser.add_argument_group("Data")
    group.add_argument("--data-root",
                       help="directory with train.rec/.idx and val.rec/.idx, used for the files not given one by "
                            "one (default, without any data flag: /data/imagenet/train-val-recordio-passthrough)")
    group.add_argument("--data-train", help="training RecordIO (.rec)")
    group.add_argument("--data-train-idx", help="index of the training RecordIO (default: the .idx beside it)")
    group.add_argument("--data-val", help="validation RecordIO (.rec)")
    group.add_argument("--data-val-idx", help="index of the validation RecordIO (default: the .idx beside it)")
    group.add_argument("--data-backend", choices=cli.DATA_BACKENDS,
                       help="data loading backend (default: dali-gpu with a GPU, dali-cpu without)")
    group.add_argument("--image-shape", type=int_list, help="network input C,H,W (C=4 pads a zero channel)")
    group.add_argument("--rgb-mean", type=float_list, help="per-channel mean subtracted from the RGB pixels")
    group.add_argument("--rgb-std", type=float_list,
                       help="per-channel standard deviation the RGB pixels are divided by")
    group.add_argument("--input-layout", choices=["NCHW", "NHWC"], help="layout of the input batch")
    group.add_argument("--num-examples", type=int,
                       help="training samples per epoch (default: the number of records in --data-train)")
    group.add_argument("--data-val-resize", type=int,
                       help="validation: resize the shorter side to this, then centre-crop the image shape")
    group.add_argument("--data-mxnet-threads", type=int,
                       help="decoding threads of the mxnet backend (default: cores per process)")
    group.add_argument("--test-io", action="store_true", help="only iterate the data and print images/s")
    group.add_argument("--test-io-mode", choices=["train", "val"], help="which iterator --test-io times")
    group.add_argument("--test-io-grid", metavar="PNG",
                       help="with --test-io: save the first batch (rank 0) as a grid of images in this PNG, as "
                            "the network gets them (augmented, un-normalised for viewing)")
    parser.set_defaults(**cli.config_defaults(DataConfig))
    return group


def add_data_aug_args(parser):
    group = parser.add_argument_group("Augmentation", "training-time augmentation, every backend")
    group.add_argument("--min-random-area", type=float,
                       help="random-resized-crop: smallest crop area, as a fraction of the image (recipe "
                            "nvidia-2019: 0.05)")
    group.add_argument("--max-random-area", type=float,
                       help="random-resized-crop: largest crop area, as a fraction of the image")
    group.add_argument("--min-random-aspect-ratio", type=float, help="random-resized-crop: smallest aspect ratio")
    group.add_argument("--max-random-aspect-ratio", type=float, help="random-resized-crop: largest aspect ratio")
    group.add_argument("--random-mirror", type=int, choices=[0, 1], help="flip half the training images horizontally")
    group.add_argument("--auto-augment", choices=["none", "autoaugment", "randaugment", "trivialaugment"],
                       help="automatic augmentation after the crop (DALI backends; DALI's nvidia.dali.auto_aug): "
                            "AutoAugment's ImageNet policy, RandAugment (--randaugment-n/-m), TrivialAugment Wide")
    group.add_argument("--randaugment-n", type=int, help="RandAugment: operations per image")
    group.add_argument("--randaugment-m", type=int, help="RandAugment: magnitude, 0-30 (31 bins)")
    group.add_argument("--train-size", type=int_list,
                       help="training images of SIZE x SIZE (validation stays at --image-shape), or START,END: "
                            "progressive resizing over --train-size-epochs (default: --image-shape's)")
    group.add_argument("--train-size-epochs", type=int_list,
                       help="progressive resizing: FIRST,LAST (0-based epochs): START up to FIRST, END from LAST on, "
                            "linear between them in steps of --train-size-step (FFCV's start_ramp/end_ramp)")
    group.add_argument("--train-size-step", type=int, help="progressive resizing: sizes are multiples of this")
    group.add_argument("--color-jitter", type=float_list,
                       help="brightness,contrast,saturation jitter (one value: all three), factors uniform in "
                            "[1-j, 1+j] (DALI backends; 0 = off)")
    return group


def check_augmentation(cfg):
    """ValueError naming the flag for augmentation values out of range."""
    color_jitter3(cfg.color_jitter)
    if not 0 <= cfg.randaugment_m <= 30 or cfg.randaugment_n < 1:
        raise ValueError(f"--randaugment-n must be at least 1 and --randaugment-m in 0..30 (31 magnitude bins); "
                         f"got {cfg.randaugment_n} and {cfg.randaugment_m}")


def check_train_size(cfg):
    """ValueError naming the flag for a training size that cannot be planned."""
    sizes, epochs = tuple(cfg.train_size), tuple(cfg.train_size_epochs)
    if len(sizes) > 2 or any(size < 1 for size in sizes) or cfg.train_size_step < 1:
        raise ValueError(f"--train-size takes SIZE or START,END (positive), --train-size-step a positive number; got "
                         f"{','.join(map(str, sizes))} and {cfg.train_size_step}")
    if (len(sizes) == 2) != bool(epochs) or (epochs and (len(epochs) != 2 or not 0 <= epochs[0] < epochs[1])):
        raise ValueError("progressive resizing needs both --train-size START,END and --train-size-epochs FIRST,LAST "
                         f"(0 <= FIRST < LAST); got --train-size {','.join(map(str, sizes)) or 'none'} and "
                         f"--train-size-epochs {','.join(map(str, epochs)) or 'none'}")


def epoch_train_size(cfg, epoch):
    """The training images' side in ``epoch`` (0-based), or None for --image-shape's own."""
    sizes = tuple(cfg.train_size)
    if not sizes:
        return None
    if len(sizes) == 1:
        return sizes[0]
    from rn50kit.common import schedules
    return schedules.train_size(epoch, sizes[0], sizes[1], *cfg.train_size_epochs, step=cfg.train_size_step)


def train_shape(cfg, epoch=0):
    """The training batches' C,H,W: --image-shape's channels at the epoch's training size."""
    size = epoch_train_size(cfg, epoch)
    channels, height, width = cfg.image_shape
    return (channels, height, width) if size is None else (channels, size, size)


def color_jitter3(values):
    """--color-jitter's one or three values as (brightness, contrast, saturation)."""
    values = tuple(values)
    if len(values) == 1:
        return values * 3
    if len(values) != 3 or min(values) < 0:
        raise ValueError(f"--color-jitter takes one value or three (brightness,contrast,saturation), each >= 0; "
                         f"got {','.join(f'{v:g}' for v in values)}")
    return values


def add_dali_args(parser):
    group = parser.add_argument_group("DALI data backend", "used with --data-backend dali-gpu or dali-cpu")
    group.add_argument("--dali-separ-val", action="store_true",
                       help="every process validates on the whole validation set (no sharding)")
    group.add_argument("--dali-threads", type=int, help="CPU threads per training pipeline (default: cores per process)")
    group.add_argument("--dali-validation-threads", type=int,
                       help="CPU threads per validation pipeline (default: cores per process)")
    group.add_argument("--dali-prefetch-queue", type=int, help="DALI prefetch queue depth")
    group.add_argument("--dali-read-ahead", type=cli.batches_ahead,
                       help="training batches whose records a thread reads ahead of the pipeline, each in a buffer "
                            "of its own (0: read on the training step's thread)")
    group.add_argument("--dali-nvjpeg-memory-padding", type=int,
                       help="memory padding value for nvJPEG, in MB (dali-gpu only)")
    group.add_argument("--dali-fuse-decoder", type=int, choices=[0, 1],
                       help="fuse decoding and random cropping (0 = decode, then random-resized-crop)")
    group.add_argument("--dali-cpu-resize", choices=["opencv", "dali"],
                       help="what resizes the training crops on the CPU (dali-cpu, fused decoder): OpenCV's "
                            "cv2.resize, 4x faster, or DALI's fn.resize; both bilinear, the same pixels within one "
                            "grey level")
    group.add_argument("--dali-normalize", choices=["auto", "pipeline", "device"],
                       help="where dali-cpu's crops are normalized: in the pipeline (DALI's crop_mirror_normalize, "
                            "float out) or on the batch's device after the copy (uint8 crops, a quarter of the bytes "
                            "to copy, normalized by MXNet there); auto: on the device for GPUs, in the pipeline for "
                            "the CPU, where DALI's is the faster")
    group.add_argument("--dali-dont-use-mmap", action="store_true",
                       help="read the RecordIO with plain reads instead of mmap (better on network file systems)")
    return group


def check_data_files(cfg):
    """Return a one-line message naming the first missing data file of a DataConfig, or None: the files its
    backend's row names (backends.RootLayout) for each split given, and the split --test-io times."""
    layout = backends.root_layout(cfg.data_backend)
    for split in layout.splits():
        data, files = getattr(cfg, f"data_{split}"), layout.files(split)
        if not data:
            continue
        needed = [(f"--data-{split}", data, files.data)]
        if files.index:
            needed.append((f"--data-{split}-idx", getattr(cfg, f"data_{split}_idx"), files.index))
        for flag, path, name in needed:
            if not path:
                return f"{flag} is required with the {cfg.data_backend} backend; {cli.PREPARE_HINT}"
            if not backends.present(path, name):
                return f"{flag} {path} does not exist; {cli.PREPARE_HINT}"
    if cfg.test_io:
        for split in layout.splits_for(cfg.test_io_mode)[0]:
            if not getattr(cfg, f"data_{split}"):
                return f"--test-io-mode {cfg.test_io_mode} needs --data-{split}; {cli.PREPARE_HINT}"
    return None


def default_threads(local_size):
    """CPU threads for one process's data pipeline: the cores shared by the processes of a node."""
    return max(1, devices.usable_cores() // max(1, local_size))  # the affinity mask (Slurm, cgroups), not the machine


def to_layout(data, channels, dtype, layout):
    """A float32 NCHW batch from a non-DALI source as the network wants it: 4th zero channel, layout, dtype."""
    if channels == 4:
        data = mx.nd.concat(data, mx.nd.zeros_like(data.slice_axis(axis=1, begin=0, end=1)), dim=1)
    if layout == "NHWC":
        data = data.transpose((0, 2, 3, 1))
    return data.astype(dtype, copy=False)


def out_dtype(dtype):
    """The pipelines hand float16 to float16 nets; float32 and bfloat16 (cast inside AMP) get float32."""
    return "float16" if dtype == "float16" else "float32"


class BatchIterator:
    """The contract fit.py relies on, shared by every backend: ``len()`` batches per epoch of ``size`` samples,
    one epoch per ``for`` (or ``reset()``), full-shape batches whose ``pad`` counts the trailing samples that
    are padding. A backend gives ``next_arrays(valid)``: the (data, label) of the next batch, of which the first
    ``valid`` samples count; and ``restart()`` if it must do something at the start of an epoch."""

    def __init__(self, size, batch_size):
        self.size = size
        self.batch_size = batch_size
        self._served = 0  # samples of this epoch handed out so far

    def __len__(self):
        return math.ceil(self.size / self.batch_size)

    def __iter__(self):
        self._served = 0
        self.restart()
        return self

    def reset(self):
        self.__iter__()

    def restart(self):
        pass

    def next_arrays(self, valid):
        raise NotImplementedError

    def __next__(self):
        if self._served >= self.size:
            raise StopIteration
        valid = min(self.batch_size, self.size - self._served)
        data, label = self.next_arrays(valid)
        self._served += valid
        return mx.io.DataBatch(data=[data], label=[label], pad=self.batch_size - valid)


# ---------------------------------------------------------------------------------------------------------
# mxnet backend: MXNet's own ImageRecordIter, for users without DALI.

def mxnet_shard_size(total, part_index, num_parts):
    """Records in one part, as ImageRecordIter's indexed RecordIO split cuts them (dmlc-core
    IndexedRecordIOSplitter): parts of ceil(total / num_parts) records, the last one shorter."""
    step = math.ceil(total / num_parts)
    return max(0, min(step, total - part_index * step))


def count_index_entries(idx_path):
    with open(idx_path) as index:
        return sum(1 for line in index if line.strip())


class RecordIterator(BatchIterator):
    """An ``mx.io.ImageRecordIter`` as a BatchIterator: batches on ``ctx`` in the network's dtype and layout.

    ImageRecordIter reports ``pad`` = 0 even with ``round_batch=False`` (the tail of its last batch is stale
    memory), so the valid count is computed from the shard size here. Training epochs have a fixed number
    of steps (equal on every rank, as the allreduce needs): the record iterator is continued across epochs
    and restarted when it runs out, so no record is skipped.
    """

    def __init__(self, record_iter, size, batch_size, ctx, channels, dtype, layout, wrap):
        super().__init__(size, batch_size)
        self.record_iter = record_iter
        self.ctx = ctx
        self.channels, self.dtype, self.layout = channels, dtype, layout
        self.wrap = wrap

    def restart(self):
        if not self.wrap:
            self.record_iter.reset()

    def _next_record_batch(self):
        try:
            try:
                return self.record_iter.next()
            except StopIteration:
                if not self.wrap:
                    raise
                self.record_iter.reset()
                return self.record_iter.next()
        except mx.base.MXNetError as error:  # a bad image: MXNet's C++ stack names neither file nor record
            raise DataError(describe_failure(self.failing_record, error)) from None

    failing_record = None  # finds (RecordFile, record number) of an image that does not decode, or None

    def next_arrays(self, valid):
        batch = self._next_record_batch()
        # Copy first, then add the 4th channel, transpose and cast on the device (the original's order): on one
        # CPU thread these cost more than the copy.
        data = to_layout(batch.data[0].as_in_context(self.ctx), self.channels, self.dtype, self.layout)
        label = batch.label[0].reshape((-1,))
        if valid < self.batch_size:  # the stale tail may hold NaNs: give it a harmless label
            label = mx.nd.concat(label[:valid], mx.nd.zeros((self.batch_size - valid,)), dim=0)
        return data, label.as_in_context(self.ctx)


def describe_failure(failing_record, error):
    """One line for a pipeline ``error``: the record that does not decode (found by ``failing_record()``, which
    returns (RecordFile, record number) or None), else the last line of the library's message."""
    try:
        found = failing_record() if failing_record else None
    except records.RecordFileError as damaged:  # a record the start-up did not check, found damaged where read
        return str(damaged)
    if found:
        record_file, i = found
        return f"{record_file.describe(i)} does not decode as an image; {records.fix_hint(record_file.rec_path)}"
    return f"the data pipeline failed: {library_error_line(error)}; check the data with tools/check_dataset.py"


def library_error_line(error):
    """The telling line of a DALI or MXNet error (they span pages): the failing operator and what it met."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    where = next((line.rstrip(",") for line in lines if line.startswith("Error in ")), None)
    if "encountered:" in lines and lines.index("encountered:") + 1 < len(lines):
        what = lines[lines.index("encountered:") + 1]
    else:
        what = next((line for line in lines if "Error" in line and not line.startswith("Traceback")),
                    lines[0] if lines else type(error).__name__)
    return f"{where}: {what}" if where else what


def image_record_iter(failing_record, **kwargs):
    try:
        return mx.io.ImageRecordIter(**kwargs)
    except mx.base.MXNetError as error:  # it decodes its first batch at once
        raise DataError(describe_failure(failing_record, error)) from None


def part_failure_finder(record_file, part_index, num_parts, limit=50000):
    """For ImageRecordIter, which reads its part in an order we do not know: the first record of the part (up to
    ``limit`` records are decoded) that does not decode."""
    def find():
        total = len(record_file)
        start = min(total, part_index * math.ceil(total / num_parts))
        end = start + mxnet_shard_size(total, part_index, num_parts)
        bad = records.first_undecodable(record_file, range(start, min(end, start + limit)))
        return None if bad is None else (record_file, bad)
    return find


def get_mxnet_iterators(cfg, feed, rank, num_workers, local_rank, local_size, ctx):
    record_files = open_record_files(cfg)
    if "train" in record_files:
        check_mxnet_shards(record_files["train"], num_workers)
    local_batch = feed.batch_size // num_workers
    channels, height, width = cfg.image_shape
    threads = cfg.data_mxnet_threads or default_threads(local_size)
    seed = 0 if feed.seed is None else feed.seed + rank
    common = dict(data_shape=(3, height, width), batch_size=local_batch, label_width=1,
                  mean_r=cfg.rgb_mean[0], mean_g=cfg.rgb_mean[1], mean_b=cfg.rgb_mean[2],
                  std_r=cfg.rgb_std[0], std_g=cfg.rgb_std[1], std_b=cfg.rgb_std[2],
                  preprocess_threads=threads, num_parts=num_workers, part_index=rank)
    out = dict(channels=channels, dtype=out_dtype(feed.dtype), layout=cfg.input_layout, ctx=ctx)
    train_iter = val_iter = None
    files = record_files or {}
    if cfg.data_train:
        finder = part_failure_finder(files["train"], rank, num_workers) if "train" in files else None
        record_iter = image_record_iter(
            finder, path_imgrec=cfg.data_train, path_imgidx=cfg.data_train_idx, shuffle=True, seed=seed,
            seed_aug=None if feed.seed is None else seed,
            random_resized_crop=True, min_random_area=cfg.min_random_area, max_random_area=cfg.max_random_area,
            min_aspect_ratio=cfg.min_random_aspect_ratio, max_aspect_ratio=cfg.max_random_aspect_ratio,
            rand_mirror=bool(cfg.random_mirror), round_batch=True,
            **dict(common, data_shape=(3,) + train_shape(cfg)[1:]))
        total = count_index_entries(cfg.data_train_idx)
        steps = math.ceil((cfg.num_examples or total) / feed.batch_size)
        train_iter = RecordIterator(record_iter, steps * local_batch, local_batch, wrap=True, **out)
        train_iter.failing_record = finder
    if cfg.data_val:
        finder = part_failure_finder(files["val"], rank, num_workers) if "val" in files else None
        record_iter = image_record_iter(
            finder, path_imgrec=cfg.data_val, path_imgidx=cfg.data_val_idx, shuffle=False,
            resize=cfg.data_val_resize,
            rand_crop=False, rand_mirror=False, round_batch=False, **common)
        size = mxnet_shard_size(count_index_entries(cfg.data_val_idx), rank, num_workers)
        val_iter = RecordIterator(record_iter, size, local_batch, wrap=False, **out)
        val_iter.failing_record = finder
    return train_iter, val_iter


# ---------------------------------------------------------------------------------------------------------
# synthetic backend

class SyntheticIterator(BatchIterator):
    """Random images made once on the device, for compute-only benchmarks, with learnable labels.

    Each label is a fixed random linear rule applied to the image (argmax over classes of ``W . features``,
    the features being the per-channel means of the four image quadrants), so a network can learn it and
    validation, on fresh images of the same distribution labelled by the same rule, measures learning.
    (The original kit validated random labels on a second random batch: chance accuracy by construction.)
    ``pool`` distinct batches are made and served in turn, to bound device memory.
    """

    def __init__(self, batch_size, image_shape, num_classes, num_batches, ctx, dtype="float32",
                 layout="NCHW", rule_seed=0, image_seed=1, pool=4):
        channels, height, width = image_shape
        mx.random.seed(rule_seed, ctx=ctx)  # the rule is shared by train and val: same seed
        rule = mx.nd.random.normal(shape=(4 * channels, num_classes), ctx=ctx)
        mx.random.seed(image_seed, ctx=ctx)
        self.batches = []
        for _ in range(min(pool, num_batches)):
            data = mx.nd.random.uniform(-1, 1, shape=(batch_size, channels, height, width), ctx=ctx)
            label = mx.nd.argmax(mx.nd.dot(quadrant_means(data), rule), axis=1)
            if layout == "NHWC":
                data = data.transpose((0, 2, 3, 1))
            self.batches.append((data.astype(dtype), label.astype("float32")))
        mx.nd.waitall()
        super().__init__(num_batches * batch_size, batch_size)

    def next_arrays(self, valid):
        return self.batches[self._served // self.batch_size % len(self.batches)]


def quadrant_means(data):
    """(N, C, H, W) -> (N, 4*C): each channel's mean over the four quadrants, standardised so the rule's
    classes are balanced whatever the image size (the raw means shrink as 1/sqrt(H*W))."""
    pooled = mx.nd.contrib.AdaptiveAvgPooling2D(data, output_size=2).reshape((data.shape[0], -1))
    return pooled * math.sqrt(data.shape[2] * data.shape[3] / 4 * 3)  # uniform(-1,1) variance is 1/3


def get_synthetic_iterators(cfg, feed, rank, num_workers, local_rank, local_size, ctx):
    local_batch = feed.batch_size // num_workers
    steps = math.ceil((cfg.num_examples or 32 * feed.batch_size) / feed.batch_size)
    seed = 0 if feed.seed is None else feed.seed
    common = dict(batch_size=local_batch, image_shape=cfg.image_shape, num_classes=feed.num_classes, ctx=ctx,
                  dtype=out_dtype(feed.dtype), layout=cfg.input_layout, rule_seed=seed)
    train = SyntheticIterator(num_batches=steps, image_seed=seed * 1000 + 2 * rank + 1, **common)
    val = SyntheticIterator(num_batches=max(1, steps // 4), image_seed=seed * 1000 + 2 * rank + 2, **common)
    return train, val


# ---------------------------------------------------------------------------------------------------------
# DALI backends: dali.py's pipelines, fed and wrapped here.

class ShuffledShardSource:
    """The training pipeline's records: this rank's shard of one permutation of the whole file per epoch.

    Every epoch draws a new permutation of all records from (seed, epoch), the same on every rank, and rank r
    reads its slice [N*r//S, N*(r+1)//S) of it: shards are disjoint, each record is read once per epoch, and each
    rank's batches are a uniform sample of the whole file whatever order it was written in. DALI's own reader
    cannot do this: it splits the file into contiguous ranges (``shuffle_after_epoch`` only reorders whole files)
    and its ``random_shuffle`` mixes a window of ``initial_fill`` neighbouring records.

    Called by ``fn.external_source`` once per batch, on the thread that runs the pipeline (the training step's):
    returns the encoded images and their labels. The records of the next ``ahead`` batches are already being
    read by the process's RecordReader thread, so a batch's page faults or reads (random reads on a cold cache
    or a network file system) are not in series with the step. Each batch is read into one of ``ahead + 1``
    buffers, reused: DALI copies a batch when the call returns (``no_copy`` is off), before the next call.
    """

    def __init__(self, record_file, shard_id, num_shards, batch_size, seed, remember=16, ahead=2, start=None,
                 num_classes=None):
        self.records, self.num_classes = record_file, num_classes
        self.order = records.ShardOrder(len(record_file), shard_id, num_shards, seed) if start is None else \
            records.ElasticOrder(len(record_file), shard_id, num_shards, batch_size, seed, start)
        self.batch_size = batch_size
        self.recent = collections.deque(maxlen=remember)  # record numbers of the batches handed to DALI last
        self._reader = record_reader()
        self._buffers = [np.empty(0, dtype=np.uint8) for _ in range(ahead + 1)]
        self._pending = collections.deque()  # (picks, buffer number, future) of the batches being read, in order
        self._next_buffer = 0
        self.read_error = None  # a damaged record met in reading (records.RecordFileError)

    def __call__(self):
        while len(self._pending) < len(self._buffers):  # the buffer of the batch last returned is free again
            picks = self.order.take(self.batch_size)
            number, self._next_buffer = self._next_buffer, (self._next_buffer + 1) % len(self._buffers)
            self._pending.append((picks, number, self._reader.submit(
                read_batch, self.records, picks, self._buffers[number], self.num_classes)))
        picks, number, future = self._pending[0]
        try:
            buffer, images, labels = future.result()  # a reading error is raised here, in the call of its batch
        except records.RecordFileError as damaged:  # DALI wraps it in a page of its own: failing_record names it
            self.read_error = damaged
            raise
        self._pending.popleft()
        self._buffers[number] = buffer  # grown, when the batch did not fit
        self.recent.append(picks)
        return images, labels

    def failing_record(self):
        """(record file, record number) of the batches in flight that does not decode, or None; raises the
        RecordFileError of a damaged record met in reading."""
        if self.read_error is not None:
            raise self.read_error
        return undecodable_for_dali(self.records, [i for batch in self.recent for i in batch])


def read_batch(record_file, picks, buffer, num_classes=None):
    """Records ``picks``' images copied into ``buffer`` (a larger one when they do not fit): (buffer, the images as
    views into it, labels). The copies touch the mapped file (page faults, outside the GIL), or read it with
    use_mmap=False, on the thread that calls this."""
    labels, images = zip(*(record_file.record(i) for i in picks)) if picks else ((), ())
    need = sum(len(image) for image in images)
    if len(buffer) < need:
        buffer = np.empty(need + need // 4, dtype=np.uint8)  # room for larger batches to come
    views, start = [], 0
    for image in images:
        end = start + len(image)
        buffer[start:end] = image
        views.append(buffer[start:end])
        start = end
    if num_classes:
        check_batch_labels(record_file, picks, np.array(labels, dtype=np.float64), num_classes)
    return buffer, views, np.array(labels, dtype=np.float32).reshape(-1, 1)


def check_batch_labels(record_file, picks, labels, num_classes):
    """Raise RecordReadError naming the first of records ``picks`` whose label is not a class 0 to ``num_classes``
    - 1, as label_problem does for the records the start-up read (records with extra labels are not judged)."""
    with np.errstate(invalid="ignore"):
        bad = np.flatnonzero(~((labels == np.floor(labels)) & (labels >= 0) & (labels < num_classes)))
    for position in bad:
        i = picks[position]
        payload = record_file.payload(i)
        if len(payload) >= 4 and payload[:4].view("<u4")[0]:  # extra labels: not a classification label
            continue
        raise records.RecordReadError(
            f"{record_file.describe(i)} has label {labels[position]:g}, not a class 0 to {num_classes - 1} "
            f"(--num-classes {num_classes}); {records.fix_hint(record_file.rec_path)}")


class RecordReader:
    """One daemon thread that runs reads (``submit``: a concurrent.futures.Future) in the order submitted.
    The process keeps one (``record_reader``) for all its sources, across epochs and pipelines: no thread is
    started per pipeline, and what a thread allocates stays in the arena of a thread that lives on. A daemon:
    an exiting process does not wait on a read (a hung network file system)."""

    def __init__(self):
        self._jobs = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread = None

    def submit(self, function, *args):
        future = concurrent.futures.Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():  # first use, or in a forked child
                self._thread = threading.Thread(target=self._run, name="record-reader", daemon=True)
                self._thread.start()
        self._jobs.put((future, function, args))
        return future

    def _run(self):
        while True:
            future, function, args = self._jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function(*args))
                except BaseException as error:  # raised where the batch is taken
                    future.set_exception(error)
            del future, function, args  # a finished batch's buffer is not held here till the next job


_record_reader = None


def record_reader():
    """This process's RecordReader."""
    global _record_reader
    if _record_reader is None:
        _record_reader = RecordReader()
    return _record_reader


def shard_size(total, shard_id, num_shards):
    """Samples in one shard, as DALI's readers split them: shard s reads [N*s//S, N*(s+1)//S)."""
    return total * (shard_id + 1) // num_shards - total * shard_id // num_shards


class DaliIterator(BatchIterator):
    """A DALI pipeline's batches (dali.DaliBatches) for ``size`` samples per epoch: the last batch of an epoch
    keeps its full shape (static shapes for hybridized nets), its ``pad`` says how many trailing samples are
    padding. A batch stays valid until two more are drawn (a dali-cpu batch for the CPU, for as long as it is
    referenced: see dali.DaliBatches). A pipeline failure names its record
    (``failing_record``: finds (RecordFile, record number) or None)."""

    def __init__(self, batches, size, failing_record=None):
        super().__init__(size, batches.batch_size)
        self.batches = batches
        self.failing_record = failing_record

    def next_arrays(self, valid):
        try:
            return self.batches.next()
        except RuntimeError as error:  # DALI reports a bad image as a multi-page C++ stack: name the record
            raise DataError(describe_failure(self.failing_record, error)) from None


_warned_partial_epochs = set()


def get_dali_iterators(cfg, feed, rank, num_workers, local_rank, local_size, ctx):
    """Train and val iterators for this rank (dali-gpu or dali-cpu). ``feed.batch_size`` is the global batch."""
    import dali  # only now: DALI is a large import, and only its backends need it
    dali.shut_down_finalized_pipelines()  # the last epoch's, if a collection off the main thread finalized it
    record_files = open_record_files(cfg)
    device = backends.get(cfg.data_backend).pipeline_device
    if device == "gpu" and ctx.device_type != "gpu":
        raise ValueError("--data-backend dali-gpu needs a GPU context; use --data-backend dali-cpu")
    device_id = ctx.device_id if device == "gpu" else None  # the GPU of this rank (or of this part of a batch)
    local_batch = feed.batch_size // num_workers
    threads = cfg.dali_threads or default_threads(local_size)
    val_threads = cfg.dali_validation_threads or default_threads(local_size)
    seed = None if feed.seed is None else feed.seed + rank  # each rank augments differently
    common = dict(image_shape=cfg.image_shape, mean=cfg.rgb_mean, std=cfg.rgb_std, dtype=feed.dtype,
                  layout=cfg.input_layout, device=device, nvjpeg_padding_mb=cfg.dali_nvjpeg_memory_padding)
    on_device = dali.normalizes_on_device(cfg.dali_normalize, device, ctx)
    common["normalize"] = not on_device

    def batches(pipe, image_shape):
        normalize = None
        if on_device:  # the pipeline hands over uint8 crops
            normalize = dali.DeviceNormalize(image_shape, cfg.rgb_mean, cfg.rgb_std, feed.dtype, cfg.input_layout)
        return dali.DaliBatches(pipe, ctx, normalize=normalize)
    train_iter = val_iter = None
    if cfg.data_train:
        train_records = record_files["train"]
        # The record order must be the same on every rank (disjoint shards): seeded by --seed, not by the rank.
        # Without --seed it is seed 0's order (augmentation stays random).
        source = ShuffledShardSource(train_records, rank, num_workers, local_batch,
                                     seed=0 if feed.seed is None else feed.seed,
                                     remember=cfg.dali_prefetch_queue + 4,  # the batches DALI may hold
                                     ahead=cfg.dali_read_ahead, start=feed.start, num_classes=feed.num_classes)
        train_common = dict(common, image_shape=train_shape(cfg))
        pipe = dali.train_pipeline(
            source=source, random_area=(cfg.min_random_area, cfg.max_random_area),
            random_aspect_ratio=(cfg.min_random_aspect_ratio, cfg.max_random_aspect_ratio),
            random_mirror=bool(cfg.random_mirror), fuse_decoder=bool(cfg.dali_fuse_decoder),
            cpu_resize=cfg.dali_cpu_resize,
            auto_augment=cfg.auto_augment, randaugment=(cfg.randaugment_n, cfg.randaugment_m),
            color_jitter=color_jitter3(cfg.color_jitter), enable_conditionals=dali.needs_conditionals(cfg.auto_augment),
            batch_size=local_batch, num_threads=threads, device_id=device_id, seed=seed,
            prefetch_queue_depth=cfg.dali_prefetch_queue, **train_common)
        pipe.build()
        total = len(train_records)
        num_examples = cfg.num_examples or total
        if num_examples < total and rank == 0 and cfg.data_train not in _warned_partial_epochs:
            _warned_partial_epochs.add(cfg.data_train)  # the pipeline is rebuilt each epoch: say it once
            log.warning("--num-examples %d is below the %d records of %s: each epoch reads only part of the "
                        "data (a random part of a new shuffle each epoch)", num_examples, total, cfg.data_train)
        # Same number of steps on every rank (the allreduce needs it); round up so no sample is dropped.
        steps = math.ceil(num_examples / feed.batch_size) if feed.steps is None else feed.steps
        train_iter = DaliIterator(batches(pipe, train_common["image_shape"]), steps * local_batch,
                                  source.failing_record)
    if cfg.data_val:
        shard_id, num_shards = (0, 1) if cfg.dali_separ_val else (rank, num_workers)
        pipe = dali.val_pipeline(
            rec_path=cfg.data_val, idx_path=cfg.data_val_idx, shard_id=shard_id, num_shards=num_shards,
            resize_shorter=cfg.data_val_resize, batch_size=local_batch, num_threads=val_threads,
            device_id=device_id, seed=seed, prefetch_queue_depth=cfg.dali_prefetch_queue,
            dont_use_mmap=cfg.dali_dont_use_mmap, **common)
        pipe.build()
        total = dali.reader_epoch_size(pipe)
        val_iter = DaliIterator(batches(pipe, cfg.image_shape), shard_size(total, shard_id, num_shards))
        val_iter.failing_record = sequential_failure_finder(record_files["val"], val_iter, shard_id, num_shards,
                                                            lookahead=(cfg.dali_prefetch_queue + 2) * local_batch)
    return train_iter, val_iter


def undecodable_for_dali(record_file, candidates):
    """(record file, record number) of the first of ``candidates`` that does not decode, or None: OpenCV's verdict,
    then DALI's own decoder's (stricter about some damage OpenCV passes)."""
    import dali
    bad = records.first_undecodable(record_file, candidates)
    if bad is None:
        candidates = list(candidates)
        position = dali.first_undecodable(record_file.image(i) for i in candidates)
        bad = None if position is None else candidates[position]
    return None if bad is None else (record_file, bad)


def sequential_failure_finder(record_file, iterator, shard_id, num_shards, lookahead):
    """For a pipeline reading its shard in file order: the undecodable record among those in flight."""
    def find():
        start, end = records.shard_bounds(len(record_file), shard_id, num_shards)
        first = start + iterator._served
        return undecodable_for_dali(record_file, range(first, min(end, first + lookahead)))
    return find


_opened = {}  # (path, index, mmap, sizes, mtimes) -> RecordFile: train.py rebuilds the training pipeline per epoch


def open_record_file(rec_path, idx_path, use_mmap=True):
    """A records.RecordFile, its index checked against the file once (offsets and record headers only)."""
    stats = [os.stat(path) for path in (rec_path, idx_path)]
    key = (rec_path, idx_path, use_mmap, tuple((s.st_size, s.st_mtime_ns) for s in stats))
    if key not in _opened:
        try:
            _opened[key] = records.RecordFile(rec_path, idx_path, use_mmap=use_mmap)
        except records.RecordFileError as error:
            raise DataError(str(error)) from None
    return _opened[key]


def open_record_files(cfg):
    """{"train": RecordFile, "val": RecordFile} for the data given, each checked before any pipeline is built,
    so a bad file stops the run with one line naming tools/check_dataset.py, not a C++ assertion."""
    use_mmap = not cfg.dali_dont_use_mmap
    files = {}
    for split in ("train", "val"):
        rec = getattr(cfg, f"data_{split}")
        if rec:
            files[split] = open_record_file(rec, getattr(cfg, f"data_{split}_idx"), use_mmap)
    return files


def record_labels(cfg):
    """The distinct class labels of a DataConfig's record files, read from the record headers by the index
    check (every record of a small file, a sample of a large one: records.checked_records; cached: the pipelines
    reuse the opened files); empty for a backend that makes its own data."""
    if not backends.reads_records(cfg.data_backend):
        return set()
    labels = set()
    for records_file in open_record_files(cfg).values():
        values = records_file.labels[np.isfinite(records_file.labels)]  # NaN: extra labels, not a class
        labels.update(np.unique(values).astype(np.int64).tolist())
    return labels


def label_problem(cfg, num_classes):
    """One line naming the file and the first record whose label is not a class 0 to ``num_classes`` - 1 (not an
    integer, NaN, negative, too large, infinite), or None. A reader would pass such a label on as it is (2.5, 1e-38),
    and the loss would take it for another class. Records with extra labels (NaN here) are not judged. The records
    judged are those the index check read (records.checked_records); the training pipelines judge the others
    as they read them (check_batch_labels)."""
    if not backends.reads_records(cfg.data_backend):
        return None
    for records_file in open_record_files(cfg).values():
        labels = records_file.labels
        with np.errstate(invalid="ignore"):
            bad = np.flatnonzero(~records_file.extra_labels & (np.isnan(labels) | (labels != np.floor(labels)) |
                                                               (labels < 0) | (labels >= num_classes)))
        if not len(bad):
            continue
        first, top, where = bad[0], np.nanmax(labels), records_file.describe(records_file.checked[bad[0]])
        integers = labels[bad] == np.floor(labels[bad])
        if np.isfinite(top) and np.all(integers & (labels[bad] >= num_classes)):  # likely a wrong --num-classes
            return (f"the data has labels up to {int(top)} but --num-classes is {num_classes}; use --num-classes "
                    f"{int(top) + 1} (the first such record: {where}, label {int(labels[first])})")
        return (f"{where} has label {labels[first]:g}, not a class 0 to {num_classes - 1} (--num-classes "
                f"{num_classes}); {len(bad)} record(s) so; {records.fix_hint(records_file.rec_path)}")
    return None


def check_mxnet_shards(train_records, num_workers):
    """ImageRecordIter gives each worker a contiguous part of the file (dmlc-core's IndexedRecordIOSplitter,
    shuffled within the part only): on a file stored in label order each worker would see a few classes and
    BatchNorm statistics would differ per worker. Refuse that; one worker reads a permutation of the whole file."""
    if num_workers < 2:
        return
    runs = records.label_runs(train_records.labels)
    if runs["ordered"]:
        raise DataError(f"{train_records.rec_path}: {records.describe_label_order(runs)}, and the mxnet backend "
                        f"gives each of the {num_workers} workers a contiguous part of it (a few classes each); "
                        f"use --data-backend dali-cpu or dali-gpu (they shuffle over the whole file), or write a "
                        f"shuffled copy with `tools/check_dataset.py {train_records.rec_path} --fix OUT.rec`")


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


class PerDeviceIterator:
    """Iterates one iterator per device together: each batch has one data and one label array per device and
    ``pads``, the padding of each part (``pad`` is their sum). Training shards have equal lengths; a validation
    shard that ends first repeats its last batch as all padding, so every part keeps its shape."""

    def __init__(self, iterators):
        self.iterators = list(iterators)

    def __len__(self):
        return max(len(iterator) for iterator in self.iterators)

    def __iter__(self):
        for iterator in self.iterators:
            iter(iterator)
        self._last = [None] * len(self.iterators)
        self._steps = 0
        return self

    def reset(self):
        self.__iter__()

    def __next__(self):
        if self._steps >= len(self):
            raise StopIteration
        self._steps += 1
        pads = []
        for i, iterator in enumerate(self.iterators):
            try:
                self._last[i] = next(iterator)
                pads.append(self._last[i].pad)
            except StopIteration:
                pads.append(None)  # all padding
        # A shard with no samples at all borrows another part's batch (split() moves it to its device).
        parts = [last if last is not None else next(b for b in self._last if b is not None) for last in self._last]
        pads = [pad if pad is not None else part.data[0].shape[0] for pad, part in zip(pads, parts)]
        batch = mx.io.DataBatch(data=[b.data[0] for b in parts], label=[b.label[0] for b in parts], pad=sum(pads))
        batch.pads = pads
        return batch


# ---------------------------------------------------------------------------------------------------------
# --test-io

def save_image_grid(images, path, mean, std, layout="NCHW", columns=8):
    """Write a batch (N images, normalised, NCHW or NHWC, 3 or 4 channels: the 4th is padding) as one PNG grid,
    ``columns`` images a row, pixels un-normalised (x * std + mean) to 0-255. Returns the grid (RGB, uint8)."""
    import cv2
    batch = images.asnumpy() if hasattr(images, "asnumpy") else np.asarray(images)
    batch = batch.astype(np.float32)
    if layout == "NCHW":
        batch = batch.transpose(0, 2, 3, 1)
    batch = batch[..., :3] * np.asarray(std, np.float32) + np.asarray(mean, np.float32)
    batch = np.clip(np.rint(batch), 0, 255).astype(np.uint8)
    count, height, width, _ = batch.shape
    columns = min(columns, count)
    rows = math.ceil(count / columns)
    grid = np.zeros((rows * height, columns * width, 3), np.uint8)
    for i, image in enumerate(batch):
        row, column = divmod(i, columns)
        grid[row * height:(row + 1) * height, column * width:(column + 1) * width] = image
    if not cv2.imwrite(path, grid[:, :, ::-1]):  # OpenCV writes BGR
        raise DataError(f"--test-io-grid {path}: cannot write a PNG there")
    return grid


def test_io(run_cfg, train_iter, val_iter, dist=None, epochs=1, out=print):
    """Iterate the chosen iterator only (no network) for ``epochs`` epochs and report images/s.

    Every batch is waited for, so a GPU pipeline is timed to the end of its copy. The first batch (pipeline
    start-up, prefetch fill) is excluded from the rate. With ``dist`` the images of all ranks are summed.
    Returns {"images": ..., "seconds": ..., "images_per_sec": ...} for this rank's share.
    """
    mode, disp_batches = run_cfg.data.test_io_mode, run_cfg.fit.disp_batches
    iterator = train_iter if mode == "train" else val_iter
    if iterator is None:
        raise ValueError(f"--test-io-mode {mode} needs --data-{mode}")
    primary = dist is None or dist.is_primary
    images, start, steps = 0, None, len(iterator) * epochs
    step = 0
    for _ in range(epochs):
        for batch in iterator:
            for array in batch.data + batch.label:  # one per device with --kv-store device
                array.wait_to_read()
            step += 1
            if start is None:
                if run_cfg.data.test_io_grid and primary:
                    cfg = run_cfg.data
                    save_image_grid(batch.data[0], cfg.test_io_grid, cfg.rgb_mean, cfg.rgb_std, cfg.input_layout)
                    out(f"test-io: saved the first {mode} batch as {cfg.test_io_grid}")
                start = time.time()  # timing starts after the first batch
                continue
            images += sum(data.shape[0] for data in batch.data) - batch.pad
            if primary and disp_batches and step % disp_batches == 0:
                rate = images / max(time.time() - start, 1e-9)
                eta = (steps - step) * batch.data[0].shape[0] / max(rate, 1e-9)
                out(f"test-io {mode} [{step}/{steps}] {rate:.1f} img/s (this rank), ETA {eta:.0f} s")
    seconds = time.time() - start if start is not None else 0.0
    total = images
    if dist is not None:
        total = dist.sum([images], "test_io.images")[0]
    rate = total / max(seconds, 1e-9)
    if primary:
        out(f"test-io {mode} backend {run_cfg.data.data_backend}: {int(total)} images in {seconds:.2f} s, "
            f"{rate:.1f} images/s")
    return {"images": total, "seconds": seconds, "images_per_sec": rate}
