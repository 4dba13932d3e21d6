"""Seeded hostile copies of the files the kit reads besides records (issue 57): configuration and recipe TOML, a
workspace's config.toml, state.json and run.lock, .safetensors headers, a checkpoint's .params, .idx files and
class-name lists. Run as a script (``KIND FOLDER COUNT SEED``), it writes COUNT mutations of FOLDER's base file
of that kind, puts each through the kit's own reader in this one process and prints a JSON line per case before
(``start``) and after (``done``, with "refused" and the message, "accepted" with whether the result is what an
independent reading of the bytes says, or "crashed" with the traceback): a process that dies names its case
(tests/e2e/test_hostile_files.py)."""
import contextlib
import io
import json
import math
import os
import random
import re
import shutil
import sys
import traceback

# --- mutations ----------------------------------------------------------------------------------------------

HOSTILE_VALUES = [10 ** 30, -1, 0, float("nan"), float("inf"), "x", "", [], {}, None, True, [1, "a"], {"a": [1]}]
DEEP = 100000  # nesting levels: past Python's recursion limit


def byte_damage(data, rng):
    """Truncation, flipped bytes, inserted junk or an emptied file."""
    kind = rng.choice(["truncate", "flip", "flip", "insert", "empty"])
    if kind == "truncate" or not data:
        return kind, data[:rng.randrange(len(data) + 1)]
    if kind == "flip":
        out = bytearray(data)
        for _ in range(rng.choice([1, 1, 3, 20])):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return kind, bytes(out)
    if kind == "insert":
        at = rng.randrange(len(data) + 1)
        return kind, data[:at] + bytes(rng.randrange(256) for _ in range(rng.choice([1, 7, 300]))) + data[at:]
    return kind, b""


def json_paths(value, path=()):
    yield path
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from json_paths(inner, path + (key,))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from json_paths(inner, path + (index,))


def json_damage(data, rng):
    """A value of the JSON document replaced by a wrong type, a huge number, NaN or a deep nesting."""
    document = json.loads(data)
    path = rng.choice(list(json_paths(document))[1:] or [()])
    deep = rng.random() < 0.08
    text = "\0DEEP\0" if deep else rng.choice(HOSTILE_VALUES)
    if not path:
        document = text
    else:
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = text
    out = json.dumps(document, indent=1)
    if deep:
        out = out.replace('"\\u0000DEEP\\u0000"', "[" * DEEP + "]" * DEEP)
    return f"{'deep nesting' if deep else 'wrong value'} at {'/'.join(map(str, path))}", out.encode()


TOML_VALUES = ["1e999", "nan", "inf", "-1", "0", "99999999999999999999999", '"x"', '""', "[1, 2]", "{a = 1}", "true",
               "1979-05-27", "[" * DEEP + "]" * DEEP, "'''\n", "[[]]"]


def toml_damage(data, rng):
    """A value of a ``key = value`` line replaced by another type, a huge number, NaN, infinity or deep nesting."""
    lines = data.decode().split("\n")
    keyed = [i for i, line in enumerate(lines) if re.match(r"\s*[\w-]+\s*=", line)]
    i = rng.choice(keyed)
    value = rng.choice(TOML_VALUES)
    lines[i] = lines[i].split("=", 1)[0] + "= " + value
    return f"line {i + 1} = {value[:20]}", "\n".join(lines).encode()


def lines_damage(data, rng):
    """A line of a text list (.idx, class names) replaced: a field dropped or added, a huge or negative number,
    NaN, a very long line, other bytes."""
    lines = data.split(b"\n")
    i = rng.randrange(len(lines))
    fields = lines[i].split(b"\t")
    value = rng.choice([b"", b"-1", b"nan", b"99999999999999999999999", b"1e3", b"x" * 100000, b"\xff\xfe",
                        b"a\tb\tc", b"0x10", b"\0"])
    fields[rng.randrange(len(fields))] = value
    lines[i] = b"\t".join(fields)
    return f"line {i + 1}", b"\n".join(lines)


def safetensors_damage(data, rng):
    """The 8-byte header length or the JSON header damaged (the tensors' bytes stay)."""
    import struct
    size = struct.unpack("<Q", data[:8])[0]
    header, body = data[8:8 + size], data[8 + size:]
    choice = rng.random()
    if choice < 0.25:
        length = rng.choice([0, 1, size - 1, size + 1, 2 ** 63, 2 ** 64 - 1, len(data), 10 ** 12])
        return f"header length {length}", struct.pack("<Q", length) + header + body
    if choice < 0.5:
        kind, header = byte_damage(header, rng)
    else:
        kind, header = json_damage(header, rng)
    return f"header {kind}", struct.pack("<Q", len(header)) + header + body


MUTATE = {"config": toml_damage, "recipe": toml_damage, "workspace-config": toml_damage, "state": json_damage,
          "run-lock": json_damage, "safetensors": safetensors_damage, "params": byte_damage, "idx": lines_damage,
          "class-names": lines_damage}


def mutate(kind, data, rng):
    if rng.random() < 0.3 and kind != "safetensors":  # its tensors' bytes have no checksum: only its header
        return byte_damage(data, rng)
    return MUTATE[kind](data, rng)


# --- the kit's readers, and what each case must give ----------------------------------------------------------

def parse_args_outcome(flag, path):
    """train.py's parse_args with ``flag path``: ("refused", its error line) or ("accepted", args)."""
    import train
    from rn50kit.config import recipe as schedules
    schedules.load_recipe.cache_clear()  # it keeps a recipe by its path: every case here has the same one
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return "accepted", train.parse_args([flag, path])
    except SystemExit:
        return "refused", err.getvalue()


def toml_scalars(data):
    """{dest: value} of the file's scalar settings, by Python's own TOML parser; None when it does not parse."""
    from rn50kit.config.config_files import tomllib
    try:
        document = tomllib.loads(data.decode())
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    flat = {}
    for key, value in document.items():
        for inner_key, inner in (value.items() if isinstance(value, dict) else [(key, value)]):
            if isinstance(inner, (int, float, str)) and not isinstance(inner, bool):
                flat[inner_key.replace("-", "_")] = inner
    return flat


def read_toml_kind(flag):
    def read(path, data, base):
        outcome, value = parse_args_outcome(flag, path)
        if outcome == "refused":
            return outcome, value
        scalars = toml_scalars(data)
        if scalars is None:
            return "accepted", False
        if flag == "--recipe":  # its derived fields (the LR per 256 images, the epochs) are the recipe's own
            from rn50kit.config import recipe as schedules
            value = dict(vars(value), **schedules.load_recipe(path))
            value = type("Recipe", (), value)
        wrong = [k for k, v in scalars.items() if hasattr(value, k) and not same_setting(getattr(value, k), v)]
        return "accepted", not wrong or wrong
    return read


def same_setting(parsed, written):
    """Whether the parsed setting holds what the file wrote: a finite number equal to the written one (as the
    flag's type converts it), or the same text."""
    if isinstance(written, float) and not math.isfinite(written):
        return False  # NaN or infinity: a run silently wrong (a loss of nan, a learning rate of inf)
    if isinstance(written, (int, float)) and isinstance(parsed, (int, float)) and not isinstance(parsed, bool):
        return float(parsed) == float(written)
    if isinstance(written, (int, float)) and isinstance(parsed, (list, tuple)):  # a one-item list flag (lr_steps)
        return len(parsed) == 1 and same_setting(parsed[0], written)
    return parsed == written or str(parsed) == str(written) or isinstance(parsed, (list, tuple)) and \
        ",".join(map(str, parsed)) == str(written)


def read_state(path, data, base):
    from rn50kit.weights import checkpoint
    state, why = checkpoint.inspect(path, verify=True)
    if state is None:
        return "refused", why
    original = json.loads(base)
    return "accepted", {k: v for k, v in state.items() if k not in ("paths", "state_path")} == original


def read_run_lock(path, data, base):
    from rn50kit.reliability import run_lock
    workspace = os.path.dirname(path)
    record = run_lock.run_state(workspace)
    run_lock.describe(record)
    run_lock.busy_message(workspace, record)
    try:
        written = json.loads(data)
    except (ValueError, RecursionError):
        written = None
    if not isinstance(written, dict):
        return "accepted", record == {}  # nothing readable: no record (the lock itself is the flock, not the text)
    return "accepted", json.dumps(record) == json.dumps(written) or written.get("state") == "running"


def read_safetensors(path, data, base):
    import numpy as np

    from rn50kit.weights import pretrained
    try:
        weights, _ = pretrained.read_weights(path)
    except pretrained.PretrainedError as error:
        return "refused", str(error)
    original = pretrained.read_weights(path.replace("case", "base"))[0]
    return "accepted", weights.keys() == original.keys() and all(np.array_equal(weights[k], original[k])
                                                                for k in weights)


def read_params(path, data, base):
    from rn50kit.weights import checkpoint
    try:
        checkpoint.check_loadable(path)
    except checkpoint.CheckpointError as error:
        return "refused", str(error)
    return "accepted", data == base


def read_idx(path, data, base):
    from rn50kit.data import records
    try:
        _, keys, offsets = records.read_index_arrays(path)
    except records.RecordFileError as error:
        return "refused", str(error)
    expected = [tuple(int(f) for f in line.split()) for line in data.decode("latin-1").split("\n") if line.split()]
    return "accepted", all(len(e) == 2 for e in expected) and \
        [tuple(pair) for pair in zip(keys.tolist(), offsets.tolist())] == expected


def read_class_names(path, data, base):
    from rn50kit.config import cli
    from rn50kit.scoring import predict
    try:
        names = predict.read_names_file(path)
    except cli.UsageError as error:
        return "refused", str(error)
    try:
        expected = [line.strip() for line in data.decode().split("\n") if line.strip()]
    except UnicodeDecodeError:
        return "accepted", False
    return "accepted", names == expected


READ = {"config": read_toml_kind("--config"), "recipe": read_toml_kind("--recipe"),
        "workspace-config": read_toml_kind("--config"), "state": read_state, "run-lock": read_run_lock,
        "safetensors": read_safetensors, "params": read_params, "idx": read_idx, "class-names": read_class_names}

# Where each case is written (a checkpoint's files keep their names: the state file names them).
CASE_NAME = {"config": "case.toml", "recipe": "case.toml", "workspace-config": "case.toml",
             "state": "model-0001.state.json", "run-lock": "run.lock", "safetensors": "case.safetensors",
             "params": "model-0001.params", "idx": "case.idx", "class-names": "case.txt"}


def main(kind, folder, count, seed):
    base = open(os.path.join(folder, "base"), "rb").read()
    rng = random.Random(seed)
    cases = [mutate(kind, base, rng) for _ in range(count)]
    path = os.path.join(folder, CASE_NAME[kind])
    for number, (what, data) in enumerate(cases):
        print(json.dumps({"start": number, "what": what}), flush=True)
        with open(path, "wb") as f:
            f.write(data)
        try:
            outcome = READ[kind](path, data, base)
            line = {"outcome": outcome[0], "correct" if outcome[0] == "accepted" else "message": outcome[1]}
        except BaseException:  # anything but the kit's own refusal is a finding, SystemExit included
            line = {"outcome": "crashed", "message": traceback.format_exc()[-1500:]}
        print(json.dumps(dict(line, done=number, what=what, path=path)), flush=True)
    with open(path, "wb") as f:
        f.write(base)


if __name__ == "__main__":
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    shutil.os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
