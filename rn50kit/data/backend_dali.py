"""The DALI backends (dali-cpu, dali-gpu): dali.py's pipelines, fed (training: record_source's shuffled shard) and
wrapped as BatchIterators here. dali.py is imported only when they are built: DALI is a large import, and the
other backends do not need it installed."""
import logging
import math

from rn50kit.common import backends
from rn50kit.config import data_flags
from rn50kit.data import loaders, records
from rn50kit.data.iterators import BatchIterator
from rn50kit.data.protocol import DataError, default_threads
from rn50kit.data.record_files import describe_failure, open_record_files
from rn50kit.data.record_source import ShuffledShardSource, undecodable_for_dali

log = logging.getLogger(__name__)


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


def get_iterators(cfg, feed, rank, num_workers, local_rank, local_size, ctx):
    """The DALI backends' builder (protocol.GetIterators): train and val iterators for this rank (dali-gpu or
    dali-cpu). ``feed.batch_size`` is the global batch."""
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
        train_common = dict(common, image_shape=loaders.train_shape(cfg))
        pipe = dali.train_pipeline(
            source=source, random_area=(cfg.min_random_area, cfg.max_random_area),
            random_aspect_ratio=(cfg.min_random_aspect_ratio, cfg.max_random_aspect_ratio),
            random_mirror=bool(cfg.random_mirror), fuse_decoder=bool(cfg.dali_fuse_decoder),
            cpu_resize=cfg.dali_cpu_resize,
            auto_augment=cfg.auto_augment, randaugment=(cfg.randaugment_n, cfg.randaugment_m),
            color_jitter=data_flags.color_jitter3(cfg.color_jitter),
            enable_conditionals=dali.needs_conditionals(cfg.auto_augment),
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


def sequential_failure_finder(record_file, iterator, shard_id, num_shards, lookahead):
    """For a pipeline reading its shard in file order: the undecodable record among those in flight."""
    def find():
        start, end = records.shard_bounds(len(record_file), shard_id, num_shards)
        first = start + iterator._served
        return undecodable_for_dali(record_file, range(first, min(end, first + lookahead)))
    return find
