"""RecordIO access for the backends and train.py's checks: the record files of a run, each opened and checked once
per process (records.RecordFile: the .idx read once, the headers of a bounded sample of records read), the labels
that check read and their one-line verdicts, and the one line naming the record a pipeline failed on (OpenCV's
verdict on its image)."""
import os

import numpy as np

from rn50kit.common import backends
from rn50kit.data import records
from rn50kit.data.protocol import DataError

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


def decodes(image):
    """Whether OpenCV decodes these image bytes (to name the record a pipeline failed on)."""
    import cv2
    if len(image) == 0:
        return False
    decoded = cv2.imdecode(np.asarray(image, dtype=np.uint8), cv2.IMREAD_COLOR)
    return decoded is not None and decoded.size > 0


def first_undecodable(records, candidates):
    """The first of ``candidates`` (record numbers) whose image does not decode, or None."""
    for i in candidates:
        if not decodes(records.image(i)):
            return i
    return None


def class_count_problem(data_train, data_val, num_classes, record_labels=()):
    """(error, warning) about --num-classes against the labels of the data: ``record_labels`` (read from the
    record headers by the start-up index check, every backend that reads records) and those of the .lst files
    beside the record files (im2rec's lists; many record files have none)."""
    labels = {int(label) for label in record_labels}
    for rec in (data_train, data_val):
        lst = os.path.splitext(rec)[0] + ".lst" if rec else ""
        if lst and os.path.isfile(lst):
            labels.update(records.lst_classes(lst))  # im2rec: index \t label \t path, read once per process
    if not labels:
        return None, None
    if min(labels) < 0:
        return (f"the data has a negative label ({min(labels)}); labels must be classes 0 to N-1: check the "
                "records with tools/check_dataset.py"), None
    classes = max(labels) + 1
    if classes > num_classes:
        return (f"the data has labels up to {classes - 1} but --num-classes is {num_classes}; "
                f"use --num-classes {classes}"), None
    if classes < num_classes:
        return None, (f"--num-classes {num_classes}, but the data has {classes} classes (labels 0 to "
                      f"{classes - 1}); use --num-classes {classes} unless the other classes are meant")
    return None, None
