"""RecordIO files (.rec + .idx, the format of dmlc-core's RecordIOWriter that im2rec, MXNet and DALI use): the
index check run before any pipeline is built (the whole index, the headers of at most SAMPLE_RECORDS records:
start-up does not read the data set), labels read from record headers without decoding images, the label-order
measure, the classes of an im2rec .lst, and the globally shuffled record order each training shard reads.

Needs numpy only; tools/check_dataset.py uses it.
"""
import mmap
import os
import struct
import warnings

import numpy as np

MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack("<I", MAGIC)
IR_HEADER = struct.Struct("<IfQQ")  # flag (number of extra labels), label, id, id2: mxnet.recordio.IRHeader
LENGTH_MASK = (1 << 29) - 1
ORDERED_RUN_FACTOR = 4  # label-ordered: runs of one label this many times longer than a shuffled file's


class RecordFileError(Exception):
    """A .rec/.idx pair that no reader can use: the message is one line naming the fix."""


class RecordReadError(RecordFileError, ValueError):
    """A record found damaged where it is read (one the start-up did not check): one line naming it and the fix."""


def fix_hint(rec_path):
    return f"run `tools/check_dataset.py {rec_path} --fix OUT.rec` and train on OUT.rec"


# ---------------------------------------------------------------------------------------------------------
# reading

def read_record(buffer, offset):
    """Return (payload, end) of the record starting at ``offset`` of ``buffer`` (a file's bytes, or its map)."""
    return read_record_at(lambda start, count: bytes(buffer[start:start + count]), len(buffer), offset)


def read_record_at(read, size, offset):
    """(payload, end) of the record at ``offset`` of a file of ``size`` bytes, ``read(start, count)`` giving its
    bytes; records whose payload contains the magic word are stored in parts (cflag 1 = first, 2 = middle, 3 =
    last) joined by that word. A RecordFileError says what is wrong where."""
    parts, pos, first = [], offset, True
    while True:
        if pos + 8 > size:
            raise RecordFileError(f"record header at byte {pos} is cut off by the end of the file ({size} bytes)")
        magic, lrec = struct.unpack("<II", read(pos, 8))
        if magic != MAGIC:
            raise RecordFileError(f"no record starts at byte {pos} (bad magic number)")
        cflag, length = lrec >> 29, lrec & LENGTH_MASK
        if first and cflag not in (0, 1):
            raise RecordFileError(f"byte {pos} is the middle of a multi-part record, not its start")
        start, end = pos + 8, pos + 8 + length
        if end > size:
            raise RecordFileError(f"record truncated: it needs {end - offset} bytes from byte {offset}, "
                                  f"the file ends after {size - offset}")
        parts.append(read(start, length))
        pos = start + ((length + 3) & ~3)
        if cflag in (0, 3):
            return b"".join(parts), pos
        parts.append(MAGIC_BYTES)
        first = False


def encode_record(payload):
    """The on-disk bytes of one record, split where the payload holds the magic word, as dmlc-core does."""
    out, start = [], 0
    for i in range(0, len(payload) - len(payload) % 4, 4):
        if payload[i:i + 4] == MAGIC_BYTES:
            out += [MAGIC_BYTES, struct.pack("<I", ((1 if start == 0 else 2) << 29) | (i - start)), payload[start:i]]
            start = i + 4
    rest = len(payload) - start
    out += [MAGIC_BYTES, struct.pack("<I", ((3 if start else 0) << 29) | rest), payload[start:]]
    out.append(b"\0" * (-len(payload) % 4))
    return b"".join(out)


INT64 = 1 << 63


def read_index(idx_path):
    """[(line number, key, offset)] and [(line number, problem)] for lines that do not parse."""
    entries, problems = [], []
    with open(idx_path, "rb") as index:
        for number, line in enumerate(index, 1):
            fields = line.split()
            if not fields:
                continue
            try:
                key, offset = (int(field) for field in fields) if len(fields) == 2 else (None, None)
                if key is None or not all(-INT64 <= value < INT64 for value in (key, offset)):
                    raise ValueError  # not two fields, or a number past int64 (numpy's parser would saturate it)
                entries.append((number, key, offset))
            except ValueError:
                problems.append((number, f"index line {number} is not 'KEY<TAB>OFFSET': {line[:60]!r}"))
    return entries, problems


def read_index_arrays(idx_path):
    """(line numbers, keys, offsets) as int64 arrays, parsed in C; the line-by-line parser names a bad line."""
    with open(idx_path, "rb") as index:
        text = index.read()
    try:
        with warnings.catch_warnings():  # numpy warns (and will raise) where a line does not parse
            warnings.simplefilter("ignore", DeprecationWarning)
            values = np.fromstring(text, dtype=np.int64, sep=" ") if text.strip() else np.zeros(0, np.int64)
    except ValueError:
        values = np.zeros(1, np.int64)  # odd length: take the slow path
    lines = text.count(b"\n") + (0 if text.endswith(b"\n") or not text else 1)
    digits_only = not text.translate(None, b"0123456789 \t\r\n")
    saturated = values.size and (values.max() == INT64 - 1 or values.min() == -INT64)  # maybe past int64
    if digits_only and len(values) == 2 * lines and not saturated:  # every line holds two integers
        pairs = values.reshape(-1, 2)
        return np.arange(1, lines + 1), pairs[:, 0].copy(), pairs[:, 1].copy()
    entries, problems = read_index(idx_path)  # slow path: empty lines, or a line that does not parse
    if problems:
        raise RecordFileError(f"{idx_path}: {problems[0][1]} ({len(problems)} bad line(s)); {{hint}}")
    table = np.array(entries, dtype=np.int64).reshape(-1, 3)
    return table[:, 0], table[:, 1], table[:, 2]


def map_file(path):
    """The whole file as a read-only buffer (b"" when empty: mmap refuses empty files)."""
    if not os.path.getsize(path):
        return b""
    with open(path, "rb") as handle:
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


SAMPLE_RECORDS = 4096  # start-up reads the headers of every record of a file up to this many, else of this many
SAMPLE_BLOCK = 64  # consecutive records per sampled block: the label-order measure needs runs in file order
HEADER_BYTES = 8 + IR_HEADER.size  # a record header and the image-record header after it: label and flag
WILL_NEED_BYTES = 1 << 24  # at most this much of a record is asked for in one read (ImageNet's mean: 110 KB)


def checked_records(total):
    """The record numbers (file order) whose headers the start-up reads: all of them up to SAMPLE_RECORDS, else
    SAMPLE_RECORDS in blocks of SAMPLE_BLOCK consecutive records spread evenly, the first and the last included."""
    if total <= SAMPLE_RECORDS:
        return np.arange(total, dtype=np.int64)
    starts = np.linspace(0, total - SAMPLE_BLOCK, SAMPLE_RECORDS // SAMPLE_BLOCK).round().astype(np.int64)
    return np.unique((starts[:, None] + np.arange(SAMPLE_BLOCK)).ravel())


def read_headers(path, offsets, size):
    """The first HEADER_BYTES bytes at each offset, as a (count, HEADER_BYTES) uint8 array (zeros past the end of
    the file): one positioned read each with read-ahead off, so a check of N records brings about N pages of the
    file into memory, not a read-ahead window each (as faults through a map do)."""
    heads = np.zeros((len(offsets), HEADER_BYTES), dtype=np.uint8)
    descriptor = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_RANDOM)
        for row, offset in enumerate(np.asarray(offsets).tolist()):
            if 0 <= offset < size:
                chunk = os.pread(descriptor, HEADER_BYTES, offset)
                heads[row, :len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
    finally:
        os.close(descriptor)
    return heads


def scan_headers(heads, offsets, size):
    """For each offset and its header bytes (read_headers): (problem or None, cflag, payload length, label,
    whether it has extra labels), from the 8-byte record header and the 24-byte image-record header after it,
    vectorised."""
    offsets = np.asarray(offsets, dtype=np.int64)
    count = len(offsets)
    problems = np.zeros(count, dtype=np.int8)  # 0 ok, 1 past the end, 2 no record starts, 3 middle, 4 truncated
    cflags = np.zeros(count, dtype=np.int64)
    lengths = np.zeros(count, dtype=np.int64)
    labels = np.full(count, np.nan, dtype=np.float64)
    extra = np.zeros(count, dtype=bool)  # records with extra labels (flag > 0): their label is NaN here
    inside = (offsets >= 0) & (offsets + 8 <= size)
    problems[~inside] = 1
    if size and inside.any():
        starts = offsets[inside]
        words = np.ascontiguousarray(heads[inside, :8]).view("<u4").reshape(-1, 2)
        magic_ok = words[:, 0] == MAGIC
        cflag = (words[:, 1] >> 29).astype(np.int64)
        length = (words[:, 1] & LENGTH_MASK).astype(np.int64)
        problem = np.where(~magic_ok, 2, np.where((cflag != 0) & (cflag != 1), 3,
                                                  np.where((cflag == 0) & (starts + 8 + length > size), 4, 0)))
        problems[inside], cflags[inside], lengths[inside] = problem, cflag, length
        has_label = inside.copy()
        has_label[inside] = (problem == 0) & (length >= IR_HEADER.size) & (starts + 8 + IR_HEADER.size <= size)
        if has_label.any():
            flags = np.ascontiguousarray(heads[has_label, 8:12]).view("<u4").ravel()
            values = np.ascontiguousarray(heads[has_label, 12:16]).view("<f4").ravel().astype(np.float64)
            labels[has_label] = np.where(flags == 0, values, np.nan)  # extra labels: not a classification label
            extra[has_label] = flags != 0
    return problems, cflags, lengths, labels, extra


PROBLEM_TEXT = {1: "points past the end of the file",
                2: "points where no record starts (not a record boundary)",
                3: "points into the middle of a multi-part record",
                4: "points to a record cut off by the end of the file",
                5: "points to a record that runs into the next one (its length field is damaged)"}


def check_extents(read_gap, size, limits, problems, cflags, lengths, starts):
    """Mark (in ``problems``) the records that do not end (padding included) by ``limits``, the next record's start
    or the end of the file: DALI reads each record within that gap and fails in C++ otherwise. A record in parts
    (cflag 1, rare) is read (``read_gap(start, limit)``: its bytes) and walked part by part."""
    ends = starts + 8 + ((lengths + 3) & ~3)
    over = (problems == 0) & (cflags == 0) & (ends > limits)
    problems[over] = np.where(limits[over] == size, 4, 5)
    for i in np.flatnonzero((problems == 0) & (cflags == 1)):
        try:
            _, end = read_record(read_gap(int(starts[i]), int(limits[i])), 0)
        except RecordFileError:
            end = size + 1
        if end > limits[i] - starts[i]:
            problems[i] = 4 if limits[i] == size else 5


class RecordFile:
    """A checked .rec/.idx pair: record offsets (in file order), the labels of the records checked, and random
    access to images.

    Construction reads the whole index and the headers of ``checked_records`` (every record of a file of up to
    SAMPLE_RECORDS, else SAMPLE_RECORDS of them: at most SAMPLE_RECORDS x HEADER_BYTES bytes, one page each in the
    page cache), and raises RecordFileError with one line naming the first problem and the fix. Every other record
    is checked when it is read (``payload``), which names it in the same words. ``labels`` and ``extra_labels``
    belong to the records ``checked``. ``use_mmap=False`` reads records with plain reads (network file systems),
    as DALI's ``dont_use_mmap`` does.
    """

    def __init__(self, rec_path, idx_path, use_mmap=True):
        self.rec_path, self.idx_path = rec_path, idx_path
        self.size = size = os.path.getsize(rec_path)
        try:
            lines, keys, offsets = read_index_arrays(idx_path)
        except RecordFileError as error:
            raise RecordFileError(str(error).replace("{hint}", fix_hint(rec_path))) from None
        if not size:
            raise RecordFileError(f"{rec_path} is empty (0 bytes); rebuild it, or {fix_hint(rec_path)}")
        if not len(offsets):
            raise RecordFileError(f"{idx_path} lists no records; rebuild the index with the .rec, or "
                                  f"{fix_hint(rec_path)}")
        order = np.argsort(offsets, kind="stable")  # file order, as DALI and MXNet read it
        lines, self.keys, self.offsets = lines[order], keys[order], offsets[order]
        self.checked = checked_records(len(offsets))
        starts = self.offsets[self.checked]
        problems, cflags, lengths, self.labels, self.extra_labels = scan_headers(
            read_headers(rec_path, starts, size), starts, size)
        past = (self.offsets < 0) | (self.offsets + 8 > size)  # from the index alone: every record
        problems[past[self.checked]] = 1
        following = np.searchsorted(self.offsets, starts, side="right")  # the next record's start (a repeat: later)
        limits = np.append(self.offsets, size)[following]
        check_extents(self._read_gap, size, limits, problems, cflags, lengths, starts)
        bad_checked = self.checked[np.flatnonzero(problems)]
        bad = np.union1d(bad_checked, np.flatnonzero(past))
        if len(bad):
            first = bad[0]
            problem = problems[np.searchsorted(self.checked, first)] if first in bad_checked else 1
            raise RecordFileError(
                f"{idx_path} line {lines[first]} (record {self.keys[first]}) {PROBLEM_TEXT[problem]} of "
                f"{rec_path} (byte {self.offsets[first]} of {size}); {len(bad)} of {len(offsets)} index entries "
                f"are bad{'' if len(self.checked) == len(offsets) else f' (the headers of {len(self.checked)} read)'}; "
                f"{fix_hint(rec_path)}")
        if np.any(self.offsets[1:] == self.offsets[:-1]):
            raise RecordFileError(f"{idx_path} lists the same record more than once; {fix_hint(rec_path)}")
        self._buffer = map_file(rec_path) if use_mmap else None  # mapped, not read: pages come in as records are
        self._fd = None if use_mmap else os.open(rec_path, os.O_RDONLY)
        self._no_read_ahead()

    def __len__(self):
        return len(self.offsets)

    def describe(self, i):
        return f"{self.rec_path} record {self.keys[i]} (byte {self.offsets[i]})"

    def _no_read_ahead(self):
        """Reads bring in the bytes asked for, no more: a fault in a map otherwise reads a whole read-ahead window
        around it (read_ahead_kb: 128 KB to 8 MB, more on network file systems), 70 to 4,000 times the page cache
        a random record needs. The map's records are asked for ahead of the faults instead (_will_need)."""
        if self._fd is not None and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)
        if self._buffer is not None and hasattr(mmap, "MADV_RANDOM"):
            self._buffer.madvise(mmap.MADV_RANDOM)

    def _will_need(self, start, limit):
        """Ask for bytes [start, limit) of the map in one read (the record, up to WILL_NEED_BYTES), before the
        faults that copy it take them page by page."""
        if hasattr(mmap, "MADV_WILLNEED") and limit > start:
            aligned = start - start % mmap.PAGESIZE
            self._buffer.madvise(mmap.MADV_WILLNEED, aligned, min(limit, start + WILL_NEED_BYTES) - aligned)

    def _read_gap(self, start, limit):
        with open(self.rec_path, "rb") as handle:
            return os.pread(handle.fileno(), max(0, limit - start), start)

    def _read(self, start, count):
        if self._fd is not None:
            return os.pread(self._fd, count, start)
        return self._buffer[start:start + count]

    def _damaged(self, i, problem):
        return RecordReadError(f"the index entry of {self.describe(i)} {PROBLEM_TEXT[problem]} ({self.size} "
                               f"bytes); {fix_hint(self.rec_path)}")

    def payload(self, i):
        """Record ``i``'s payload (label header + image) as a uint8 array (a view into the mapped file, or read
        with a positioned read), its header checked against the index as the start-up checks it: a record that
        fails raises RecordReadError naming it."""
        offset = int(self.offsets[i])
        limit = min(int(self.offsets[i + 1]) if i + 1 < len(self.offsets) else self.size, self.size)
        if offset < 0 or offset + 8 > self.size:
            raise self._damaged(i, 1)
        if self._buffer is not None:
            self._will_need(offset, limit)
        magic, lrec = struct.unpack("<II", self._read(offset, 8))
        cflag, length = lrec >> 29, lrec & LENGTH_MASK
        if magic != MAGIC or cflag not in (0, 1):
            raise self._damaged(i, 2 if magic != MAGIC else 3)
        if cflag == 0:
            if offset + 8 + ((length + 3) & ~3) > limit:  # as check_extents: padding included
                raise self._damaged(i, 4 if limit == self.size else 5)
            if self._fd is not None:
                return np.frombuffer(os.pread(self._fd, length, offset + 8), dtype=np.uint8)
            return np.frombuffer(self._buffer, dtype=np.uint8, count=length, offset=offset + 8)
        try:  # rare: the payload holds the magic word, stored in parts within the gap to the next record
            payload, _ = read_record(self._read(offset, max(0, limit - offset)), 0)
        except RecordFileError:
            raise self._damaged(i, 4 if limit == self.size else 5) from None
        return np.frombuffer(payload, dtype=np.uint8)

    def record(self, i):
        """Record ``i``'s (label, encoded image bytes): NaN for a record with extra labels (not a class)."""
        payload = self.payload(i)
        if len(payload) < IR_HEADER.size:
            return float("nan"), payload[len(payload):]
        flag, label = struct.unpack_from("<If", payload)
        return (float(label) if flag == 0 else float("nan")), payload[IR_HEADER.size + 4 * flag:]

    def image(self, i):
        """Record ``i``'s encoded image bytes (after the label header and any extra labels)."""
        return self.record(i)[1]


# ---------------------------------------------------------------------------------------------------------
# im2rec's .lst (index \t label(s) \t relative/path): the classes and their folders, read once per process

_lst_classes = {}  # (path, size, mtime) -> {label: class folder}


def lst_classes(path):
    """{label: class folder (the first part of the path, the last line's for a label listed twice)} of an im2rec
    .lst, kept per process: train.py's class-count check and the class names read it once. Vectorised: numpy
    parses every line's label field and finds the distinct ones, and only one line per distinct label is split in
    Python (about half the time of a loop over the lines; once per process instead of twice)."""
    stat = os.stat(path)
    key = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
    if key not in _lst_classes:
        if len(_lst_classes) > 8:  # a run reads two or three lists
            _lst_classes.clear()
        _lst_classes[key] = classes_of_lines(np.fromfile(path, dtype=np.uint8))
    return _lst_classes[key]


def classes_of_lines(data):
    """lst_classes of a .lst's bytes."""
    ends = np.flatnonzero(data == ord("\n"))
    if len(data) and data[-1] != ord("\n"):
        ends = np.append(ends, len(data))
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
    tabs = np.append(np.flatnonzero(data == ord("\t")), [len(data) + 1, len(data) + 1])
    first = np.searchsorted(tabs, starts)
    lines = np.flatnonzero(tabs[first + 1] < ends)  # at least three fields: index, label(s), path
    values, plain = plain_labels(data, tabs[first[lines]] + 1, tabs[first[lines] + 1])
    keys = values[plain][::-1]
    if len(keys) and keys.max() < 1 << 16:  # classes: a stable sort of 16-bit keys is a radix sort, 4x faster
        keys = keys.astype(np.uint16)
    _, last = np.unique(keys, return_index=True)  # each distinct label's last line
    picked = np.concatenate([lines[plain][np.count_nonzero(plain) - 1 - last], lines[~plain]])
    classes = {}
    for line in np.sort(picked).tolist():  # in file order: a later line wins
        parts = data[starts[line]:ends[line]].tobytes().decode("utf-8", "replace").rstrip("\r").split("\t")
        classes[int(float(parts[1]))] = parts[-1].replace("\\", "/").split("/")[0]
    return classes


def plain_labels(data, begin, end):
    """The label fields data[begin:end] as integers, and which are plain (digits, then optionally a point and
    zeros, as im2rec writes them: "7.000000"); the others are left to Python's float()."""
    values = np.zeros(len(begin), dtype=np.int64)
    plain = (end > begin) & (end - begin <= 18)
    in_integer = plain.copy()
    for column in range(int((end - begin)[plain].max()) if plain.any() else 0):
        inside = begin + column < end
        char = data[np.minimum(begin + column, len(data) - 1)]
        digit = (char >= ord("0")) & (char <= ord("9"))
        point = inside & (char == ord(".")) & in_integer & (column > 0)
        plain &= ~inside | (in_integer & (digit | point)) | (~in_integer & (char == ord("0")))
        values = np.where(inside & in_integer & digit, values * 10 + (char.astype(np.int64) - ord("0")), values)
        in_integer &= ~point
    return values, plain


# ---------------------------------------------------------------------------------------------------------
# label order

def label_runs(labels):
    """How much a file's labels come in runs: mean and longest run of one label in file order, and the mean run a
    shuffled file with the same class counts would have (1 / (1 - sum of squared class shares))."""
    labels = np.asarray(labels)
    labels = labels[np.isfinite(labels)] if labels.dtype.kind == "f" else labels
    if len(labels) == 0:
        return {"mean_run": 0.0, "longest_run": 0, "shuffled_run": 0.0, "classes": 0, "ordered": False}
    change = np.flatnonzero(labels[1:] != labels[:-1])
    bounds = np.concatenate([[0], change + 1, [len(labels)]])
    runs = np.diff(bounds)
    _, counts = np.unique(labels, return_counts=True)
    shares = counts / len(labels)
    same = float(np.sum(shares ** 2))
    shuffled = 1.0 / (1.0 - same) if same < 1 else float(len(labels))
    mean_run = float(len(labels) / len(runs))
    ordered = len(counts) > 1 and mean_run > ORDERED_RUN_FACTOR * shuffled and mean_run >= 8
    return {"mean_run": mean_run, "longest_run": int(runs.max()), "shuffled_run": shuffled,
            "classes": int(len(counts)), "ordered": bool(ordered)}


def describe_label_order(runs):
    return (f"records are stored in label order (runs of one label: mean {runs['mean_run']:.0f}, longest "
            f"{runs['longest_run']}; a shuffled file would have runs of about {runs['shuffled_run']:.1f})")


# ---------------------------------------------------------------------------------------------------------
# the training order: one global permutation per epoch, cut into disjoint shards

def shard_bounds(total, shard_id, num_shards):
    """Shard s of S holds positions [N*s//S, N*(s+1)//S), as DALI's readers split a file."""
    return total * shard_id // num_shards, total * (shard_id + 1) // num_shards


def epoch_permutation(total, seed, epoch):
    """The record order of one epoch: the same on every rank (it depends on the seed and epoch only)."""
    return np.random.default_rng([seed, epoch]).permutation(total)


def shard_records(total, shard_id, num_shards, seed, epoch):
    start, end = shard_bounds(total, shard_id, num_shards)
    return epoch_permutation(total, seed, epoch)[start:end]


class ShardOrder:
    """This shard's record numbers, batch by batch: shard ``shard_id`` of the permutation of epoch 0, then of
    epoch 1, ... (a batch that passes the end of a shard continues into the next epoch's shard)."""

    def __init__(self, total, shard_id, num_shards, seed):
        start, end = shard_bounds(total, shard_id, num_shards)
        if end <= start:
            raise RecordFileError(f"{total} records cannot be split across {num_shards} workers; "
                                  "use fewer workers or more data")
        self.total, self.shard_id, self.num_shards, self.seed = total, shard_id, num_shards, seed
        self.epoch = 0
        self._order = shard_records(total, shard_id, num_shards, seed, 0)
        self._pos = 0

    def take(self, count):
        picks = []
        while len(picks) < count:
            if self._pos == len(self._order):
                self.epoch += 1
                self._order = shard_records(self.total, self.shard_id, self.num_shards, self.seed, self.epoch)
                self._pos = 0
            step = min(count - len(picks), len(self._order) - self._pos)
            picks.extend(self._order[self._pos:self._pos + step].tolist())
            self._pos += step
        return picks


class ElasticOrder:
    """An elastic run's record numbers, batch by batch, from position ``start`` of the epoch's permutation (the
    records the committed steps read): each global step reads the next ``num_shards`` x ``batch`` positions, shard
    s the s-th ``batch`` of them. Whatever worlds the steps ran in, what was read is a prefix of the permutation, so
    after a reset the new world reads the rest, each record once. Reads past the end (a pipeline's prefetch beyond
    the epoch's last step) wrap around and are never trained on."""

    def __init__(self, total, shard_id, num_shards, batch, seed, start):
        self.permutation = epoch_permutation(total, seed, 0)
        self.position = start + shard_id * batch
        self.stride = num_shards * batch

    def take(self, count):
        picks = np.take(self.permutation, np.arange(self.position, self.position + count), mode="wrap").tolist()
        self.position += self.stride
        return picks
