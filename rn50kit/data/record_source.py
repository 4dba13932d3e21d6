"""The records the DALI training pipeline decodes: this rank's shard of one permutation of the whole file per epoch
(ShuffledShardSource, DALI's external source), read ahead on one reader thread per process, each batch's labels
judged as it is read; and DALI's verdict on a record that does not decode."""
import collections
import concurrent.futures
import queue
import threading

import numpy as np

from rn50kit.data import records
from rn50kit.data.record_files import first_undecodable


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


def undecodable_for_dali(record_file, candidates):
    """(record file, record number) of the first of ``candidates`` that does not decode, or None: OpenCV's verdict,
    then DALI's own decoder's (stricter about some damage OpenCV passes)."""
    import dali
    bad = first_undecodable(record_file, candidates)
    if bad is None:
        candidates = list(candidates)
        position = dali.first_undecodable(record_file.image(i) for i in candidates)
        bad = None if position is None else candidates[position]
    return None if bad is None else (record_file, bad)
