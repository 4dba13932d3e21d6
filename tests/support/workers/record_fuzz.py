"""Seeded damage to a small real RecordIO pair (.rec + .idx), and what a correct reader makes of each case, read
here on its own (struct and OpenCV, not the kit's records.py). Run as a script, it puts every case of a case list
through tools/check_dataset.py's main or through train.py's start-up checks and its training or validation
iterator, in one process, and prints one JSON line per case before (``start``) and after (``done``): a process
that dies names its case (tests/e2e/test_record_fuzz.py)."""
import contextlib
import io
import json
import math
import os
import random
import struct
import sys

import cv2
import numpy as np

MAGIC = 0xCED7230A
HEADER = struct.Struct("<IfQQ")  # flag (extra labels), label, id, id2


# --- the independent reading --------------------------------------------------------------------------------

def read_at(data, offset, limit):
    """(payload, None) of the record at ``offset`` (parts joined, as dmlc-core's reader: a part of cflag 0 or 3
    ends it), which must end, padding included, by ``limit`` (the next listed record, or the end of the file: DALI
    reads each record within that gap); or (None, why)."""
    parts, pos, limit = [], offset, min(limit, len(data))
    while True:
        if pos < 0 or pos + 8 > limit:
            return None, "record header past the next record or the end"
        magic, word = struct.unpack_from("<II", data, pos)
        cflag, length = word >> 29, word & ((1 << 29) - 1)
        if magic != MAGIC or (pos == offset and cflag not in (0, 1)):
            return None, "no record starts here"
        if pos + 8 + ((length + 3) & ~3) > limit:
            return None, "record runs past the next record or the end"
        parts.append(data[pos + 8:pos + 8 + length])
        if cflag in (0, 3):
            return struct.pack("<I", MAGIC).join(parts), None
        pos += 8 + ((length + 3) & ~3)


def expected(data, index_text, num_classes, images=None):
    """What a correct reader makes of a case: ("bad", why), or ("good", labels in file order, records whose image
    OpenCV cannot decode: a reader may refuse those or read them). ``images``: a dict that gets each record's
    image bytes."""
    entries = []
    for number, line in enumerate(index_text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2 or not all(f.lstrip("-").isdigit() for f in fields):
            return "bad", f"index line {number} does not parse"
        entries.append((int(fields[1]), int(fields[0])))
    if not entries:
        return "bad", "no records"
    entries.sort()
    if len({offset for offset, _ in entries}) != len(entries):
        return "bad", "a record listed twice"
    labels, undecodable = [], []
    for k, (offset, key) in enumerate(entries):
        payload, why = read_at(data, offset, entries[k + 1][0] if k + 1 < len(entries) else len(data))
        if images is not None and payload is not None:
            images[key] = payload[HEADER.size:]
        if why:
            return "bad", f"record {key}: {why}"
        if len(payload) < HEADER.size:
            return "bad", f"record {key}: no label header"
        flag, label, _, _ = HEADER.unpack_from(payload)
        if flag != 0 or not math.isfinite(label) or label != int(label) or not 0 <= label < num_classes:
            return "bad", f"record {key}: label {label!r} (flag {flag}) is not one class in [0, {num_classes})"
        image = np.frombuffer(payload[HEADER.size:], np.uint8)
        if not len(image) or cv2.imdecode(image, cv2.IMREAD_COLOR) is None:
            undecodable.append(key)
        labels.append(int(label))
    return "good", labels, undecodable


# --- the cases ------------------------------------------------------------------------------------------------

def record_offsets(index_text):
    return sorted(int(line.split()[1]) for line in index_text.splitlines() if line.strip())


def set_bytes(data, at, value):
    data[at:at + len(value)] = value[:max(0, len(data) - at)]


def mutate(rng, base, index, other_index):
    """(kind, rec bytes, index text): one seeded fault of ``base`` (bytes) and ``index`` (its text)."""
    data, offsets = bytearray(base), record_offsets(index)
    lines = index.splitlines()
    at = rng.choice(offsets)
    kind = rng.choice(["flip", "flip record header", "flip label header", "label", "flag", "length", "truncate at a "
                       "record", "truncate in a header", "truncate in an image", "random bytes", "offset off a "
                       "record", "offset past the end", "index from another file", "index line", "image bytes"])
    if kind == "flip":
        for _ in range(rng.randint(1, 3)):
            bit = rng.randrange(len(data) * 8)
            data[bit // 8] ^= 1 << bit % 8
    elif kind in ("flip record header", "flip label header"):
        start = at if kind == "flip record header" else at + 8
        bit = rng.randrange((8 if kind == "flip record header" else HEADER.size) * 8)
        data[start + bit // 8] ^= 1 << bit % 8
    elif kind == "label":
        value = rng.choice([0.0, 1.0, 2.0, 2.5, -1.0, 3.0, 1e9, float("nan"), float("inf"), -0.0, 0.999])
        set_bytes(data, at + 12, struct.pack("<f", value))
    elif kind == "flag":
        set_bytes(data, at + 8, struct.pack("<I", rng.choice([1, 2, 5, 1 << 20, 0xFFFFFFFF])))
    elif kind == "length":
        word = struct.unpack_from("<I", data, at + 4)[0]
        length = word & ((1 << 29) - 1)
        new = rng.choice([0, 3, length - 1, length + 1, length + 4, length * 2, (1 << 29) - 1])
        set_bytes(data, at + 4, struct.pack("<I", (word & ~((1 << 29) - 1)) | (max(new, 0) & ((1 << 29) - 1))
                                            if rng.random() < 0.7 else (rng.randint(1, 7) << 29) | length))
    elif kind == "truncate at a record":
        del data[at:]
    elif kind == "truncate in a header":
        del data[at + rng.randint(1, 8 + HEADER.size - 1):]
    elif kind == "truncate in an image":
        cut = at + 8 + HEADER.size + rng.randint(1, 200)
        del data[cut:]
    elif kind == "random bytes":
        set_bytes(data, rng.randrange(len(data)), bytes(rng.randrange(256) for _ in range(8)))
    elif kind == "image bytes":
        start = at + 8 + HEADER.size + rng.choice([0, 2, 20, 100])
        set_bytes(data, start, bytes(rng.choice([0, 0xFF, 0xD9]) for _ in range(rng.choice([1, 2, 16]))))
    elif kind in ("offset off a record", "offset past the end", "index line"):
        k = rng.randrange(len(lines))
        key, offset = lines[k].split()
        if kind == "offset off a record":
            lines[k] = f"{key}\t{int(offset) + rng.choice([-8, -4, -1, 1, 2, 4, 8, 12, 32])}"
        elif kind == "offset past the end":
            lines[k] = f"{key}\t{len(data) + rng.choice([0, 1, 4096])}"
        else:
            lines[k] = rng.choice([f"{key} {offset} 7", "garbage", f"{key}\t", f"{key}\t{offset}.5", lines[k - 1]])
        index = "\n".join(lines) + "\n"
    elif kind == "index from another file":
        index = other_index
    return kind, bytes(data), index


def make_cases(folder, base_rec, base_idx, other_idx, count, seed, num_classes):
    """Write ``count`` seeded cases into ``folder``; returns their list (paths, kind, the expected reading)."""
    rng = random.Random(seed)
    base, index, other = open(base_rec, "rb").read(), open(base_idx).read(), open(other_idx).read()
    base_images, cases = {}, []
    expected(base, index, num_classes, base_images)
    for n in range(count):
        kind, data, text = mutate(rng, base, index, other)
        images = {}
        reading = expected(data, text, num_classes, images)
        rec, idx = os.path.join(folder, f"case{n:03d}.rec"), os.path.join(folder, f"case{n:03d}.idx")
        with open(rec, "wb") as f:
            f.write(data)
        with open(idx, "w") as f:
            f.write(text)
        changed = sorted(key for key, image in images.items() if image != base_images.get(key))
        cases.append({"n": n, "kind": kind, "rec": rec, "idx": idx, "expected": list(reading),
                      "changed_images": changed})
    return cases


# --- the drivers ------------------------------------------------------------------------------------------------

def through_check_dataset(case, num_classes):
    import check_dataset
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            status = check_dataset.main([case["rec"], "--idx", case["idx"], "--num-classes", str(num_classes),
                                         "--jobs", "1", "--progress", "0"])
        except SystemExit as exit_:
            status = exit_.code
    return {"status": status, "output": out.getvalue()}


def through_reader(case, num_classes, split):
    """train.py's checks at start-up (the index, the labels against --num-classes) and its ``split`` iterator for
    one epoch (the training one shuffles: its labels come back sorted)."""
    import mxnet as mx

    import train
    from rn50kit.config import train_config
    from rn50kit.config.cli import UsageError
    from rn50kit.data import loaders, protocol
    from rn50kit.training import announce
    args = train.parse_args(["--mode", "val" if split == "val" else "train", "--data-backend", "dali-cpu",
                             f"--data-{split}", case["rec"], f"--data-{split}-idx", case["idx"], "--batch-size", "4",
                             "--image-shape", "3,32,32", "--data-val-resize", "32", "--num-classes", str(num_classes),
                             "--dali-validation-threads", "1", "--dali-threads", "1", "--seed", "1",
                             "--num-epochs", "1", "--warmup-epochs", "0"])
    try:
        cfg = train_config.from_args(args)
        announce.warn_about(cfg, True)
        iterators = loaders.get_data_iterators(cfg, 0, 1, 0, 1, mx.cpu())
        labels = []
        for batch in iterators[0 if split == "train" else 1]:
            labels += batch.label[0].asnumpy()[:batch.data[0].shape[0] - batch.pad].tolist()
        return {"labels": labels if split == "val" else sorted(labels)}
    except (UsageError, protocol.DataError) as error:
        return {"error": str(error)}


def main(mode, cases_path, start, num_classes):
    import traceback
    for case in json.load(open(cases_path))[start:]:
        print(json.dumps({"start": case["n"]}), flush=True)
        try:
            result = through_check_dataset(case, num_classes) if mode == "check" else \
                through_reader(case, num_classes, mode)
        except Exception:  # noqa: BLE001 - a finding: the test reports it
            result = {"traceback": traceback.format_exc()}
        print(json.dumps({"done": case["n"], **result}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
