"""The mxnet backend: MXNet's own ImageRecordIter (decoding on the CPU), for users without DALI.

Its start-up reads the .idx once for the kit (record_files: the index check, the record count) and once in
ImageRecordIter (dmlc-core's IndexedRecordIOSplitter, in C++), and of the .rec only the sampled headers of the
index check and the records of its first batches: nothing in it scans the .rec.
"""
import math

import mxnet as mx

from rn50kit.data import loaders, records
from rn50kit.data.iterators import BatchIterator, to_layout
from rn50kit.data.protocol import DataError, default_threads, out_dtype
from rn50kit.data.record_files import describe_failure, first_undecodable, open_record_files


def mxnet_shard_size(total, part_index, num_parts):
    """Records in one part, as ImageRecordIter's indexed RecordIO split cuts them (dmlc-core
    IndexedRecordIOSplitter): parts of ceil(total / num_parts) records, the last one shorter."""
    step = math.ceil(total / num_parts)
    return max(0, min(step, total - part_index * step))


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
        bad = first_undecodable(record_file, range(start, min(end, start + limit)))
        return None if bad is None else (record_file, bad)
    return find


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


def get_iterators(cfg, feed, rank, num_workers, local_rank, local_size, ctx):
    """The mxnet backend's builder (protocol.GetIterators). The record counts come from the index the kit's check
    read (record_files, once per process), not from another pass over the .idx."""
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
    if cfg.data_train:
        finder = part_failure_finder(record_files["train"], rank, num_workers)
        record_iter = image_record_iter(
            finder, path_imgrec=cfg.data_train, path_imgidx=cfg.data_train_idx, shuffle=True, seed=seed,
            seed_aug=None if feed.seed is None else seed,
            random_resized_crop=True, min_random_area=cfg.min_random_area, max_random_area=cfg.max_random_area,
            min_aspect_ratio=cfg.min_random_aspect_ratio, max_aspect_ratio=cfg.max_random_aspect_ratio,
            rand_mirror=bool(cfg.random_mirror), round_batch=True,
            **dict(common, data_shape=(3,) + loaders.train_shape(cfg)[1:]))
        steps = math.ceil((cfg.num_examples or len(record_files["train"])) / feed.batch_size)
        train_iter = RecordIterator(record_iter, steps * local_batch, local_batch, wrap=True, **out)
        train_iter.failing_record = finder
    if cfg.data_val:
        finder = part_failure_finder(record_files["val"], rank, num_workers)
        record_iter = image_record_iter(
            finder, path_imgrec=cfg.data_val, path_imgidx=cfg.data_val_idx, shuffle=False,
            resize=cfg.data_val_resize,
            rand_crop=False, rand_mirror=False, round_batch=False, **common)
        size = mxnet_shard_size(len(record_files["val"]), rank, num_workers)
        val_iter = RecordIterator(record_iter, size, local_batch, wrap=False, **out)
        val_iter.failing_record = finder
    return train_iter, val_iter
