"""Check an image-classification RecordIO (.rec + .idx): read every record through the index, decode every image.

    python tools/check_dataset.py PATH.rec [--idx PATH.idx] [--num-classes N] [--fix OUT.rec] [--jobs J]

Errors (exit status 1): index lines that do not parse, index entries pointing past the end of the file or to a
place where no record starts, records cut short by the end of the file, empty payloads, labels that are not
one integer class in [0, N), images that are truncated or do not decode.
Warnings: images that are not JPEG (PNG, ...), CMYK or grayscale JPEGs, unusual sizes (shorter side below
--min-side, longer side above --max-side, or aspect ratio above --max-aspect).
Warning: records stored in label order (long runs of one label), which starves shards and shuffle windows of classes.
`--fix OUT.rec` writes OUT.rec/OUT.idx without the records in error, non-JPEG and CMYK images re-encoded as RGB
JPEG (quality --quality), every other record copied byte for byte, in a shuffled order when the file is in label
order (--order); it exits 0 when the copy is clean.
Each image OpenCV decodes is also decoded by DALI's CPU decoder (the dali backends', stricter about some damage)
where DALI is importable (--no-dali: OpenCV only): an image DALI refuses is an undecodable image too (for an image
--fix re-encodes, a note in its warning). The output's "decoders:" line says which decoders judged the file.
Only OpenCV and numpy are needed (DALI when installed, as it is with the kit).
"""
import argparse
import collections
import math
import multiprocessing
import os
import sys
import time

KIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, KIT_DIR)
if __name__ == "__main__":
    from rn50kit.common import supported  # loads on the Pythons it refuses: one line, not a traceback
    supported.require_supported_python("check_dataset")
if __name__ == "__main__":  # under a Python without the kit's packages (OpenCV, numpy): the kit's, as runner does
    from rn50kit.config import cli
    cli.rerun_under_chosen_python(os.path.abspath(__file__), "check_dataset.py", KIT_DIR)

import cv2  # noqa: E402
import numpy as np  # noqa: E402

from rn50kit.data.images import image_format, jpeg_components, judge_image  # noqa: E402,F401  (one judge of images)

# RecordIO reading and writing (the format of dmlc-core's RecordIOWriter, which MXNet and DALI read)
from rn50kit.data.records import (  # noqa
    IR_HEADER,
    LENGTH_MASK,
    MAGIC,
    MAGIC_BYTES,
    describe_label_order,
    encode_record,
    label_runs,
    read_index,
    read_index_arrays,
    read_record,
    read_record_at,
)
from rn50kit.data.records import RecordFileError as RecordError

MAX_LISTED = 20  # records listed per kind of problem; the count is always complete
CHUNK = 64  # records per task of a worker


# ---------------------------------------------------------------------------------------------------------
# one record

def check_payload(payload, num_classes, limits):
    """Inspect one record's payload: (errors, warnings, info). Each problem is (kind, detail)."""
    errors, warnings = [], []
    info = {"label": None, "size": None, "format": None, "reencode": False}
    if len(payload) < IR_HEADER.size:
        errors.append(("empty payload", f"{len(payload)} bytes, less than the {IR_HEADER.size}-byte label header"))
        return errors, warnings, info
    flag, label, _, _ = IR_HEADER.unpack_from(payload)
    image = payload[IR_HEADER.size + 4 * flag:]
    if flag:
        errors.append(("bad label", f"{flag} labels in the header; a classification record has one"))
    elif not math.isfinite(label) or label != int(label):
        errors.append(("bad label", f"label {label!r} is not an integer class"))
    elif label < 0 or (num_classes and label >= num_classes):
        errors.append(("bad label", f"label {int(label)} is out of range [0, {num_classes or 'inf'})"))
    else:
        info["label"] = int(label)
    if not image:
        errors.append(("empty payload", "the record has a label but no image bytes"))
        return errors, warnings, info
    image_errors, image_warnings, image_info = judge_image(image, limits)  # rn50kit/data/images.py
    info.update(image_info)
    return errors + image_errors, warnings + image_warnings, info


# ---------------------------------------------------------------------------------------------------------
# DALI's decoder: the dali backends decode with it, and it refuses some images OpenCV decodes (a damaged marker
# before a Huffman table: libjpeg skips it and falls back to the standard table, nvImageCodec stops)

_dali = {}  # process id -> DaliDecoder: a forked worker builds its own (a pipeline's threads do not survive fork)


def dali_version():
    """(DALI's version, None) where it imports, else (None, why not)."""
    try:
        import nvidia.dali
        return nvidia.dali.__version__, None
    except Exception as error:  # not installed, or installed without its libraries
        return None, f"not importable, {type(error).__name__}: {error}".splitlines()[0]


class DaliDecoder:
    """DALI's CPU image decoder (the dali backends'), one image per run on one thread (the pool has a process per
    core). Not batched: DALI 2.4 segfaults now and then after a refused image in a batch of many (a later run or
    the failed pipeline's teardown), and a run of one costs no more per image (1.4 ms a 500x375 JPEG either way)."""

    def __init__(self):
        from nvidia.dali import fn, pipeline_def, types

        @pipeline_def(batch_size=1, num_threads=1, device_id=None, exec_pipelined=False, exec_async=False,
                      prefetch_queue_depth=1)
        def decode():
            return fn.decoders.image(fn.external_source(name="images", dtype=types.UINT8), device="cpu")
        self.make = decode
        self.pipe = None

    def refusal(self, image):
        """DALI's reason for refusing ``image`` (encoded bytes), or None when it decodes."""
        if self.pipe is None:
            self.pipe = self.make()
            self.pipe.build()
        self.pipe.feed_input("images", [np.frombuffer(image, np.uint8)])
        try:
            self.pipe.run()
            return None
        except RuntimeError as error:
            self.pipe = None  # a pipeline that failed cannot run again
            return dali_reason(str(error))


def dali_reason(message):
    """The line of a DALI pipeline error that says what went wrong (the rest is the pipeline's traceback)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    after = lines.index("encountered:") + 1 if "encountered:" in lines else 0
    reason = lines[after] if after < len(lines) else (lines[-1] if lines else "no message")
    return reason[:200]


def judge_with_dali(result, image):
    """Add DALI's verdict on ``image``, which OpenCV decoded, to ``result`` (of _check_entry): an error, or for an
    image --fix re-encodes (into a JPEG DALI reads), words in its warning."""
    decoder = _dali.get(os.getpid())
    if decoder is None:
        decoder = _dali[os.getpid()] = DaliDecoder()
    why = decoder.refusal(image)
    if why is None:
        return
    _, _, _, errors, warnings, info, _ = result
    refusal = f"OpenCV decodes it, DALI's decoder (the dali backends') refuses it: {why}"
    if info["reencode"]:
        warnings[:] = [(kind, f"{detail}; {refusal}") for kind, detail in warnings]
    else:
        errors.append(("undecodable image", f"{info['format']} data of {len(image)} bytes: {refusal}"))


# ---------------------------------------------------------------------------------------------------------
# parallel check over the index

class RecordReader:
    """A .rec read with positioned reads, read-ahead off: a check of the whole file holds a record at a time, whatever
    the file's size. (Through a map, every page touched stays resident in the process, with the read-ahead window
    faulted in around it: 8.7 GB in each worker for 1.28 million records spaced as ImageNet's.)"""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)

    def close(self):
        os.close(self.fd)

    def bytes(self, start, end):
        return os.pread(self.fd, end - start, start)

    def record(self, offset):
        """(payload, end) of the record at ``offset``: records.read_record_at, each part one positioned read."""
        return read_record_at(lambda start, count: os.pread(self.fd, count, start), self.size, offset)


_worker = {}


def _init_worker(rec_path, num_classes, limits, use_dali):
    _worker["reader"] = RecordReader(rec_path)
    _worker["args"] = (num_classes, limits)
    _worker["dali"] = use_dali


def _check_entry(entry):
    """(the entry's result, its image bytes where OpenCV decoded them, else None)."""
    number, key, offset = entry
    reader = _worker["reader"]
    if offset < 0 or offset >= reader.size:
        problem = ("dangling index entry", f"offset {offset} is past the end of the file ({reader.size} bytes)")
        return (number, key, offset, [problem], [], {"label": None, "size": None, "format": None}, None), None
    try:
        payload, end = reader.record(offset)
    except RecordError as error:
        return (number, key, offset, [("unreadable record", str(error))], [], {"label": None}, None), None
    errors, warnings, info = check_payload(payload, *_worker["args"])
    # read, labelled (one label: more is an error) and decoded by OpenCV: DALI's decoder judges it too
    image = payload[IR_HEADER.size:] if not errors else None
    return (number, key, offset, errors, warnings, info, end), image


def _check_chunk(entries):
    """_check_entry of each of ``entries``, then DALI's decoder on each image OpenCV decoded."""
    results = []
    for entry in entries:
        result, image = _check_entry(entry)
        if image is not None and _worker["dali"]:
            judge_with_dali(result, image)
        results.append(result)
    return results


def index_chunks(idx_path):
    """([(line number, key, offset)] chunks of CHUNK entries, made as they are asked for, the number of entries, the
    index's problems). The index is parsed in C into arrays where every line holds two integers, else line by line
    (naming each bad line)."""
    try:
        lines, keys, offsets = read_index_arrays(idx_path)
        problems = []
    except RecordError:
        entries, problems = read_index(idx_path)
        lines, keys, offsets = (np.array(column, dtype=np.int64) for column in zip(*entries)) if entries else \
            (np.zeros(0, np.int64),) * 3
    chunks = (list(zip(lines[i:i + CHUNK].tolist(), keys[i:i + CHUNK].tolist(), offsets[i:i + CHUNK].tolist()))
              for i in range(0, len(offsets), CHUNK))
    return chunks, len(offsets), problems


class Progress:
    """A one-line progress report on stderr (records/s and ETA), for files large enough to need one."""

    def __init__(self, total, enabled):
        self.total, self.enabled = total, enabled
        self.start = self.last = time.time()
        self.tty = sys.stderr.isatty()

    def update(self, done):
        now = time.time()
        if not self.enabled or (now - self.last < (0.5 if self.tty else 10)) and done < self.total:
            return
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        eta = (self.total - done) / max(rate, 1e-9)
        width = 30
        bar = "#" * int(width * done / max(self.total, 1))
        line = (f"[{bar:<{width}}] {done}/{self.total} records, {rate:.0f} records/s, "
                f"ETA {int(eta) // 60}:{int(eta) % 60:02d}")
        print(("\r" + line) if self.tty else line, end="" if self.tty and done < self.total else "\n",
              file=sys.stderr, flush=True)


def check(rec_path, idx_path, num_classes=0, limits=(32, 8192, 8.0), jobs=None, progress=None, dali=True):
    """Check every record; return a dict with the per-entry results, the index's problems and the decoders that
    judged the images (DALI's too with ``dali`` where it imports)."""
    chunks, total, index_problems = index_chunks(idx_path)
    version, why_not = dali_version() if dali else (None, "not asked (--no-dali)")
    decoders = {"OpenCV": cv2.__version__, "DALI": version, "DALI missing": why_not}
    results = []
    jobs = jobs or os.cpu_count() or 1
    show = Progress(total, progress if progress is not None else total >= 5000)
    init = (rec_path, num_classes, limits, version is not None)
    if jobs == 1 or total < 200:
        _init_worker(*init)
        for chunk in chunks:
            results.extend(_check_chunk(chunk))
            show.update(len(results))
        _worker.pop("reader").close()
    else:
        with multiprocessing.get_context("fork").Pool(jobs, _init_worker, init) as pool:
            for chunk_results in pool.imap(_check_chunk, chunks):
                results.extend(chunk_results)
                show.update(len(results))
    return {"entries": overlaps(results, os.path.getsize(rec_path)), "index_problems": index_problems,
            "decoders": decoders}


def overlaps(results, size):
    """The results with an error for each entry that lists a record listed before, or whose record (padding
    included) runs past the next listed record's start: readers (DALI) read each record within that gap.
    O(N log N): one sort, and the next start of every entry found by binary search."""
    by_offset = sorted(results, key=lambda r: r[2])
    starts = np.unique(np.array([r[2] for r in results if r[6] is not None], dtype=np.int64))  # where a record was read
    offsets = np.array([r[2] for r in by_offset], dtype=np.int64)
    following = np.append(starts, size)[np.searchsorted(starts, offsets, side="right")].tolist()
    for k, (number, key, offset, errors, _, _, end) in enumerate(by_offset):
        if k and by_offset[k - 1][2] == offset:
            errors.append(("repeated index entry", f"byte {offset} is listed already, as record {by_offset[k - 1][1]}"))
            continue
        if not errors and end is not None and end > following[k]:
            errors.append(("overlapping record", f"the record (its length field) runs {end - following[k]} byte(s) "
                           f"past {'the next record' if following[k] < size else 'the end of the file'}, at byte "
                           f"{following[k]}"))
    return results


def label_order(report):
    """records.label_runs of the readable records' labels in file order (the order readers shard and window)."""
    readable = sorted((offset, info["label"]) for _, _, offset, errs, _, info, _ in report["entries"] if not errs)
    return label_runs(np.array([label for _, label in readable]))


LABEL_ORDER_ADVICE = ("each worker's contiguous shard and each shuffle window of a record reader then hold a few "
                      "classes (BatchNorm statistics and gradients per worker are skewed; training suffers, most "
                      "with several workers). train.py's DALI backends shuffle over the whole file each epoch; "
                      "other readers (the mxnet backend with several workers, other tools) do not: write a "
                      "shuffled copy with --fix OUT.rec")


def summarize(report, out=print):
    """Print the problems by kind and the dataset summary; return the number of errors."""
    errors = collections.defaultdict(list)
    warnings = collections.defaultdict(list)
    for number, message in report["index_problems"]:
        errors["bad index line"].append(f"index line {number}: {message}")
    labels, widths, heights, formats = collections.Counter(), [], [], collections.Counter()
    bad_records = 0
    for number, key, offset, errs, warns, info, _ in report["entries"]:
        where = f"record {key} (index line {number}, byte {offset})"
        for kind, detail in errs:
            errors[kind].append(f"{where}: {detail}")
        for kind, detail in warns:
            warnings[kind].append(f"{where}: {detail}")
        bad_records += bool(errs)
        if not errs:
            labels[info["label"]] += 1
            widths.append(info["size"][0])
            heights.append(info["size"][1])
            formats[info["format"]] += 1
    if not report["entries"] and not report["index_problems"]:
        errors["no records"].append("the index lists no records: rebuild the dataset (tools/prepare_imagenet.sh)")
    for title, problems in (("error", errors), ("warning", warnings)):
        for kind, lines in sorted(problems.items()):
            out(f"{title}: {kind}: {len(lines)} record(s)")
            for line in lines[:MAX_LISTED]:
                out(f"  {line}")
            if len(lines) > MAX_LISTED:
                out(f"  ... and {len(lines) - MAX_LISTED} more")
    total = len(report["entries"])
    out(f"records: {total} in the index, {total - bad_records} readable, {bad_records} with errors, "
        f"{sum(len(v) for v in warnings.values())} warning(s)")
    if labels:
        counts = sorted(labels.items())
        out(f"classes: {len(labels)} (labels {counts[0][0]}..{counts[-1][0]})")
        if len(counts) <= 30:
            out("per class: " + ", ".join(f"{label}: {count}" for label, count in counts))
        else:
            values = np.array([count for _, count in counts])
            smallest, largest = min(counts, key=lambda c: c[1]), max(counts, key=lambda c: c[1])
            out(f"per class: min {smallest[1]} (class {smallest[0]}), median {int(np.median(values))}, "
                f"max {largest[1]} (class {largest[0]})")
        out(f"image sizes: width {min(widths)}..{max(widths)}, height {min(heights)}..{max(heights)}")
        out("formats: " + ", ".join(f"{kind}: {count}" for kind, count in formats.most_common()))
    runs = label_order(report)
    if runs["ordered"]:
        out(f"warning: label order: {describe_label_order(runs)}: {LABEL_ORDER_ADVICE}")
    out(describe_decoders(report["decoders"]))
    num_errors = sum(len(v) for v in errors.values())
    out(f"{'FAILED' if num_errors else 'OK'}: {num_errors} error(s)")
    return num_errors


def describe_decoders(decoders):
    """The output's line naming the decoders that judged the images."""
    if decoders["DALI"]:
        return f"decoders: OpenCV {decoders['OpenCV']} and DALI {decoders['DALI']} (the dali backends' CPU decoder)"
    return (f"decoders: OpenCV {decoders['OpenCV']} only (DALI: {decoders['DALI missing']}): training with a dali "
            "backend may still fail on an image DALI's decoder refuses")


def reencoded_record(payload, quality):
    """The record of ``payload`` (label header and image) with its image re-encoded as an RGB JPEG."""
    flag = IR_HEADER.unpack_from(payload)[0]
    header = payload[:IR_HEADER.size + 4 * flag]
    image = cv2.imdecode(np.frombuffer(payload, np.uint8, offset=len(header)), cv2.IMREAD_COLOR)
    _, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    return encode_record(header + jpeg.tobytes())


def write_fixed(report, rec_path, out_rec, quality=95, shuffle_seed=None):
    """Write out_rec and its .idx: records in error dropped, non-JPEG and CMYK images re-encoded as RGB JPEG,
    in the index's order or, with ``shuffle_seed``, in a random order (a file not sorted by label).
    Written under temporary names and renamed, so a failure leaves no half-written dataset."""
    out_idx = os.path.splitext(out_rec)[0] + ".idx"
    kept = reencoded = 0
    entries = [entry for entry in report["entries"] if not entry[3]]
    if shuffle_seed is not None:
        entries = [entries[i] for i in np.random.default_rng(shuffle_seed).permutation(len(entries))]
    reader = RecordReader(rec_path)
    try:
        with open(out_rec + ".tmp", "wb") as rec_out, open(out_idx + ".tmp", "w") as idx_out:
            for _, _, offset, errs, _, info, end in entries:
                raw = reencoded_record(reader.record(offset)[0], quality) if info["reencode"] else \
                    reader.bytes(offset, end)  # every other record copied byte for byte
                reencoded += info["reencode"]
                idx_out.write(f"{kept}\t{rec_out.tell()}\n")
                rec_out.write(raw)
                kept += 1
    finally:
        reader.close()
    os.replace(out_rec + ".tmp", out_rec)
    os.replace(out_idx + ".tmp", out_idx)
    return kept, reencoded, out_idx


def main(argv=None):
    from rn50kit.common.helptext import HelpFormatter
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument("rec", help="the RecordIO file (.rec)")
    parser.add_argument("--idx", help="its index (default: the .rec path with .idx)")
    parser.add_argument("--num-classes", type=int, default=0, help="labels must be below this (default: 0, no bound)")
    parser.add_argument("--fix", metavar="OUT.rec", help="write a repaired copy (and OUT.idx)")
    parser.add_argument("--quality", type=int, default=95, help="JPEG quality of re-encoded images")
    parser.add_argument("--order", choices=["auto", "shuffle", "keep"], default="auto",
                        help="record order of the --fix copy (auto: shuffled when the file is in label order)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --fix copy's shuffled order")
    parser.add_argument("--jobs", type=int, default=None, help="processes (default: all cores)")
    parser.add_argument("--min-side", type=int, default=32, help="warn below this shorter side")
    parser.add_argument("--max-side", type=int, default=8192, help="warn above this longer side")
    parser.add_argument("--max-aspect", type=float, default=8.0, help="warn above this aspect ratio")
    parser.add_argument("--no-dali", action="store_true",
                        help="decode with OpenCV only (faster; a dali backend may then refuse an image it passed)")
    parser.add_argument("--progress", type=int, choices=[0, 1], default=None,
                        help="progress line on stderr (default: for 5,000 records or more)")
    args = parser.parse_args(argv)
    idx = args.idx or os.path.splitext(args.rec)[0] + ".idx"
    for flag, path in (("PATH.rec", args.rec), ("--idx", idx)):
        if not os.path.isfile(path):
            parser.exit(2, f"check_dataset.py: error: {flag} {path} does not exist; give an existing "
                           f"RecordIO and its index (tools/prepare_imagenet.sh makes both)\n")
    if args.fix and os.path.abspath(args.fix) in (os.path.abspath(args.rec), os.path.abspath(idx)):
        parser.exit(2, "check_dataset.py: error: --fix must name a new file, not the input; "
                       "choose another OUT.rec\n")
    report = check(args.rec, idx, args.num_classes, (args.min_side, args.max_side, args.max_aspect), args.jobs,
                   None if args.progress is None else bool(args.progress), dali=not args.no_dali)
    num_errors = summarize(report)
    if args.fix:
        shuffle = args.order == "shuffle" or (args.order == "auto" and label_order(report)["ordered"])
        kept, reencoded, out_idx = write_fixed(report, args.rec, args.fix, args.quality,
                                               args.seed if shuffle else None)
        print(f"fixed copy: {args.fix} and {out_idx}: {kept} records ({reencoded} re-encoded as JPEG, "
              f"{len(report['entries']) - kept} dropped{', shuffled' if shuffle else ''})")
        problem = check_copy(args.fix, out_idx)
        if problem:
            print(f"FAILED: the fixed copy is not usable: {problem}")
            return 1
        print(f"OK: the fixed copy is clean; train on {args.fix}")
        return 0
    return 1 if num_errors else 0


def check_copy(rec_path, idx_path):
    """The first problem of a written copy (its index against its records, as train.py checks), or None."""
    from rn50kit.data.records import RecordFile
    try:
        copy = RecordFile(rec_path, idx_path)
    except RecordError as error:
        return str(error)
    return None if len(copy) else f"{rec_path} holds no records"


if __name__ == "__main__":
    sys.exit(main())
