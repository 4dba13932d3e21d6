"""DALI pipelines reading ImageNet RecordIO, and our own DALI-to-MXNet iterator.

DALI 2.x ships no MXNet plugin (it ended with DALI 1.39), so `DaliIterator` hands DALI's outputs to MXNet
itself: on CPU through numpy, on GPU by copying straight into the NDArray's device memory.
"""
import collections
import ctypes
import logging
import math

import mxnet as mx
import numpy as np
from nvidia.dali import fn, pipeline_def, types

import records
from data import DataError, default_threads, describe_failure

READER_NAME = "Reader"
log = logging.getLogger(__name__)


def add_dali_args(parser):
    group = parser.add_argument_group("DALI data backend", "used with --data-backend dali-gpu or dali-cpu")
    group.add_argument("--dali-separ-val", action="store_true",
                       help="every process validates on the whole validation set (no sharding)")
    group.add_argument("--dali-threads", type=int, default=None,
                       help="CPU threads per training pipeline (default: cores per process)")
    group.add_argument("--dali-validation-threads", type=int, default=None,
                       help="CPU threads per validation pipeline (default: cores per process)")
    group.add_argument("--dali-prefetch-queue", type=int, default=5, help="DALI prefetch queue depth")
    group.add_argument("--dali-nvjpeg-memory-padding", type=int, default=64,
                       help="memory padding value for nvJPEG, in MB (dali-gpu only)")
    group.add_argument("--dali-fuse-decoder", type=int, default=1, choices=[0, 1],
                       help="fuse decoding and random cropping (0 = decode, then random-resized-crop)")
    group.add_argument("--dali-dont-use-mmap", action="store_true",
                       help="read the RecordIO with plain reads instead of mmap (better on network file systems)")
    return group


def _normalize(images, image_shape, mean, std, dtype, layout, mirror, crop=True):
    channels, height, width = image_shape
    return fn.crop_mirror_normalize(
        images, dtype=types.FLOAT16 if dtype == "float16" else types.FLOAT,
        output_layout="HWC" if layout == "NHWC" else "CHW", crop=(height, width) if crop else None,
        mean=list(mean), std=list(std), mirror=mirror, pad_output=channels == 4)


@pipeline_def
def train_pipeline(source, image_shape, mean, std, dtype="float32", layout="NCHW", device="cpu",
                   random_area=(0.08, 1.0), random_aspect_ratio=(0.75, 4 / 3), random_mirror=True, fuse_decoder=True,
                   nvjpeg_padding_mb=64):
    # The records come from ``source`` (a ShuffledShardSource), not fn.readers.mxnet: the reader gives each
    # shard a contiguous range of the file and shuffles only within a 1024-record window, so on a file stored
    # in label order each worker would see a few classes (see ShuffledShardSource).
    jpegs, labels = fn.external_source(source=source, num_outputs=2, batch=True, dtype=[types.UINT8, types.FLOAT])
    decoder_device = "mixed" if device == "gpu" else "cpu"
    padding = {"device_memory_padding": nvjpeg_padding_mb << 20,
               "host_memory_padding": nvjpeg_padding_mb << 20} if device == "gpu" else {}
    _, height, width = image_shape
    # Training resizes bilinearly without an antialiasing filter (as ImageRecordIter does): on CPU the filter
    # costs about a third of the pipeline's throughput, and a random crop is an augmentation anyway.
    # Validation keeps DALI's antialiased resize: it is what accuracy is measured on.
    if fuse_decoder:
        images = fn.decoders.image_random_crop(jpegs, device=decoder_device, output_type=types.RGB,
                                               random_area=list(random_area),
                                               random_aspect_ratio=list(random_aspect_ratio), **padding)
        images = fn.resize(images, resize_x=width, resize_y=height, antialias=False)
    else:
        images = fn.decoders.image(jpegs, device=decoder_device, output_type=types.RGB, **padding)
        images = fn.random_resized_crop(images, size=(height, width), random_area=list(random_area),
                                        random_aspect_ratio=list(random_aspect_ratio), antialias=False)
    mirror = fn.random.coin_flip(probability=0.5) if random_mirror else 0
    images = _normalize(images, image_shape, mean, std, dtype, layout, mirror)
    return images, labels.gpu() if device == "gpu" else labels


@pipeline_def
def val_pipeline(rec_path, idx_path, shard_id, num_shards, image_shape, mean, std, dtype="float32",
                 layout="NCHW", device="cpu", resize_shorter=256, nvjpeg_padding_mb=64, dont_use_mmap=False):
    # pad_last_batch + stick_to_shard: each shard's epoch ends on a batch boundary (the tail is padded with
    # copies of its last sample, which DaliIterator trims), so every sample is seen exactly once.
    jpegs, labels = fn.readers.mxnet(path=[rec_path], index_path=[idx_path], shard_id=shard_id,
                                     num_shards=num_shards, random_shuffle=False, pad_last_batch=True,
                                     stick_to_shard=True, dont_use_mmap=dont_use_mmap, name=READER_NAME)
    decoder_device = "mixed" if device == "gpu" else "cpu"
    padding = {"device_memory_padding": nvjpeg_padding_mb << 20,
               "host_memory_padding": nvjpeg_padding_mb << 20} if device == "gpu" else {}
    images = fn.decoders.image(jpegs, device=decoder_device, output_type=types.RGB, **padding)
    # Resize the shorter side, centre crop: fused, so only the cropped pixels are resampled (about 1.5x
    # faster on CPU than resizing the whole image, same output).
    _, height, width = image_shape
    images = fn.resize_crop_mirror(images, resize_shorter=resize_shorter, crop=(height, width))
    images = _normalize(images, image_shape, mean, std, dtype, layout, mirror=0, crop=False)
    return images, labels.gpu() if device == "gpu" else labels


class ShuffledShardSource:
    """The training pipeline's records: this rank's shard of one permutation of the whole file per epoch.

    Every epoch draws a new permutation of all records from (seed, epoch), the same on every rank, and rank r
    reads its slice [N*r//S, N*(r+1)//S) of it: shards are disjoint, each record is read once per epoch, and each
    rank's batches are a uniform sample of the whole file whatever order it was written in. DALI's own reader
    cannot do this: it splits the file into contiguous ranges (``shuffle_after_epoch`` only reorders whole files)
    and its ``random_shuffle`` mixes a window of ``initial_fill`` neighbouring records.
    Called by ``fn.external_source`` once per batch: returns the encoded images and their labels.
    """

    def __init__(self, record_file, shard_id, num_shards, batch_size, seed, remember=16):
        self.records = record_file
        self.order = records.ShardOrder(len(record_file), shard_id, num_shards, seed)
        self.batch_size = batch_size
        self.recent = collections.deque(maxlen=remember)  # record numbers of the batches handed to DALI last

    def __call__(self):
        picks = self.order.take(self.batch_size)
        self.recent.append(picks)
        images = [self.records.image(i) for i in picks]
        labels = self.records.labels[picks].astype(np.float32).reshape(-1, 1)
        return images, labels

    def failing_record(self):
        """(record file, record number) of the batches in flight that does not decode, or None."""
        bad = records.first_undecodable(self.records, [i for batch in self.recent for i in batch])
        return None if bad is None else (self.records, bad)


def shard_size(total, shard_id, num_shards):
    """Samples in one shard, as DALI's readers split them: shard s reads [N*s//S, N*(s+1)//S)."""
    return total * (shard_id + 1) // num_shards - total * shard_id // num_shards


def _copy_into(dali_tensor, out):
    """Copy one DALI batch (a dense TensorList) into the NDArray ``out``, in one copy into its own buffer, as
    DALI's old MXNet plugin did: host to host for dali-cpu, device to device for dali-gpu (no round trip
    through the host). The copy is synchronous, so DALI may reuse its buffer afterwards."""
    mx.base._LIB.MXNDArrayWaitToWrite(out.handle)  # waits until MXNet's pending reads of ``out`` are done
    pointer = ctypes.c_void_p()
    mx.base._LIB.MXNDArrayGetData(out.handle, ctypes.byref(pointer))
    dali_tensor.copy_to_external(pointer)


def _matching(out, tensor, ctx):
    """``out`` if it fits ``tensor``, else a new NDArray that does."""
    shape, dtype = tuple(tensor.shape()), _DALI_TO_NUMPY[tensor.dtype]
    if out is None or out.shape != shape or out.dtype != np.dtype(dtype):
        out = mx.nd.empty(shape, ctx=ctx, dtype=dtype)
    return out


_DALI_TO_NUMPY = {types.FLOAT: "float32", types.FLOAT16: "float16", types.INT32: "int32",
                  types.UINT8: "uint8", types.INT64: "int64"}


class DaliIterator:
    """Iterates a built DALI pipeline as MXNet ``DataBatch``es for ``size`` samples per epoch.

    The last batch of an epoch keeps its full shape (static shapes for hybridized nets); ``batch.pad``
    says how many trailing samples are padding and must not be counted.
    Batches are copied into ``buffers`` sets of NDArrays used in turn, as DALI's old plugin and MXNet's own
    iterators do (a fresh 40 MB array per batch costs a third of the CPU pipeline's speed in page faults):
    a batch stays valid until ``buffers`` more are drawn; copy it to keep it longer.
    """

    def __init__(self, pipeline, size, ctx, buffers=2, failing_record=None):
        self.pipeline = pipeline
        self.failing_record = failing_record  # finds the record a pipeline error came from, or None
        self.size = size
        self.batch_size = pipeline.max_batch_size
        self.ctx = ctx
        self._served = 0
        self._slots = [[None, None] for _ in range(max(1, buffers))]
        self._next_slot = 0

    def __len__(self):
        return math.ceil(self.size / self.batch_size)

    def __iter__(self):
        self._served = 0
        return self

    def reset(self):
        self._served = 0

    def __next__(self):
        if self._served >= self.size:
            raise StopIteration
        try:
            images, labels = self.pipeline.run()
        except RuntimeError as error:  # DALI reports a bad image as a multi-page C++ stack: name the record
            raise DataError(describe_failure(self.failing_record, error)) from None
        slot = self._slots[self._next_slot]
        self._next_slot = (self._next_slot + 1) % len(self._slots)
        for i, tensor_list in enumerate((images, labels)):
            tensor = tensor_list.as_tensor()
            slot[i] = _matching(slot[i], tensor, self.ctx)
            _copy_into(tensor, slot[i])
        valid = min(self.batch_size, self.size - self._served)
        self._served += valid
        return mx.io.DataBatch(data=[slot[0]], label=[slot[1].reshape((-1,))], pad=self.batch_size - valid)


def get_dali_iterators(args, rank, num_workers, local_rank, local_size, ctx, record_files):
    """Train and val iterators for this rank. ``args.batch_size`` is the global batch; ``record_files`` holds the
    checked records.RecordFile of "train" and "val" (data.open_record_files)."""
    device = "gpu" if args.data_backend == "dali-gpu" else "cpu"
    if device == "gpu" and ctx.device_type != "gpu":
        raise ValueError("--data-backend dali-gpu needs a GPU context; use --data-backend dali-cpu")
    device_id = ctx.device_id if device == "gpu" else None  # the GPU of this rank (or of this part of a batch)
    local_batch = args.batch_size // num_workers
    threads = args.dali_threads or default_threads(local_size)
    val_threads = args.dali_validation_threads or default_threads(local_size)
    seed = None if args.seed is None else args.seed + rank  # each rank augments differently
    common = dict(image_shape=args.image_shape, mean=args.rgb_mean, std=args.rgb_std, dtype=args.dtype,
                  layout=args.input_layout, device=device, nvjpeg_padding_mb=args.dali_nvjpeg_memory_padding)
    train_iter = val_iter = None
    if args.data_train:
        train_records = record_files["train"]
        # The record order must be the same on every rank (disjoint shards): seeded by --seed, not by the rank.
        # Without --seed it is seed 0's order (augmentation stays random).
        source = ShuffledShardSource(train_records, rank, num_workers, local_batch,
                                     seed=0 if args.seed is None else args.seed,
                                     remember=args.dali_prefetch_queue + 4)  # the batches DALI may hold
        pipe = train_pipeline(
            source=source, random_area=(args.min_random_area, args.max_random_area),
            random_aspect_ratio=(args.min_random_aspect_ratio, args.max_random_aspect_ratio),
            random_mirror=bool(args.random_mirror), fuse_decoder=bool(args.dali_fuse_decoder),
            batch_size=local_batch, num_threads=threads, device_id=device_id, seed=seed,
            prefetch_queue_depth=args.dali_prefetch_queue, **common)
        pipe.build()
        total = len(train_records)
        num_examples = args.num_examples or total
        if num_examples < total and rank == 0:
            log.warning("--num-examples %d is below the %d records of %s: each epoch reads only part of the "
                        "data (a random part of a new shuffle each epoch)", num_examples, total, args.data_train)
        # Same number of steps on every rank (the allreduce needs it); round up so no sample is dropped.
        steps = math.ceil(num_examples / args.batch_size)
        train_iter = DaliIterator(pipe, steps * local_batch, ctx, failing_record=source.failing_record)
    if args.data_val:
        shard_id, num_shards = (0, 1) if args.dali_separ_val else (rank, num_workers)
        pipe = val_pipeline(
            rec_path=args.data_val, idx_path=args.data_val_idx, shard_id=shard_id, num_shards=num_shards,
            resize_shorter=args.data_val_resize, batch_size=local_batch, num_threads=val_threads,
            device_id=device_id, seed=seed, prefetch_queue_depth=args.dali_prefetch_queue,
            dont_use_mmap=args.dali_dont_use_mmap, **common)
        pipe.build()
        total = pipe.reader_meta(READER_NAME)["epoch_size"]
        val_iter = DaliIterator(pipe, shard_size(total, shard_id, num_shards), ctx)
        val_iter.failing_record = sequential_failure_finder(record_files["val"], val_iter, shard_id, num_shards,
                                                            lookahead=(args.dali_prefetch_queue + 2) * local_batch)
    return train_iter, val_iter


def sequential_failure_finder(record_file, iterator, shard_id, num_shards, lookahead):
    """For a pipeline reading its shard in file order: the undecodable record among those in flight."""
    def find():
        start, end = records.shard_bounds(len(record_file), shard_id, num_shards)
        first = start + iterator._served
        bad = records.first_undecodable(record_file, range(first, min(end, first + lookahead)))
        return None if bad is None else (record_file, bad)
    return find
