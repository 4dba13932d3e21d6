"""Bad input on the way in, with real files: record files whose index does not match them stop before any pipeline
is built, a record that does not decode during training is named in one line, --model-prefix may name a new
folder, and tools/check_dataset.py reports label order and writes a shuffled, clean copy."""
import os
import subprocess
import sys

import cv2
import mxnet as mx
import numpy as np
import pytest
from mxnet import recordio

import train
from rn50kit.config import train_config
from rn50kit.data import loaders, protocol, records
from support.datasets import run_tool, write_record_file
from support.processes import HANG_S, ROOT, venv_env

pytestmark = pytest.mark.slow  # launches processes or trains end to end


TOOL = os.path.join(ROOT, "tools", "check_dataset.py")


def images(count, seed=0):
    rng = np.random.RandomState(seed)
    return [cv2.resize(rng.randint(0, 255, size=(4, 5, 3), dtype=np.uint8), (40, 32)) for _ in range(count)]


@pytest.fixture
def good(tmp_path):
    return write_record_file(str(tmp_path / "good"), images(24), [i % 3 for i in range(24)])


def offsets(idx):
    with open(idx) as f:
        return [int(line.split()[1]) for line in f if line.strip()]


def write_index(path, entry_offsets):
    with open(path, "w") as f:
        f.writelines(f"{i}\t{offset}\n" for i, offset in enumerate(entry_offsets))
    return path


def bad_files(kind, tmp_path, rec, idx):
    """(rec, idx) with one kind of fault; the expected words of the message."""
    if kind == "empty rec":
        open(tmp_path / "empty.rec", "wb").close()
        return str(tmp_path / "empty.rec"), write_index(str(tmp_path / "empty.idx"), []), "is empty"
    if kind == "empty idx":
        return rec, write_index(str(tmp_path / "none.idx"), []), "lists no records"
    if kind == "past the end":
        entries = offsets(idx) + [os.path.getsize(rec) + 4096]
        return rec, write_index(str(tmp_path / "past.idx"), entries), "past the end of the file"
    if kind == "between records":
        entries = offsets(idx)
        entries[5] += 12  # inside record 5's image bytes
        return rec, write_index(str(tmp_path / "between.idx"), entries), "no record starts"
    if kind == "garbage line":
        with open(tmp_path / "garbage.idx", "w") as f:
            f.write(open(idx).read() + "not an index line\n")
        return rec, str(tmp_path / "garbage.idx"), "is not 'KEY<TAB>OFFSET'"
    raise ValueError(kind)


KINDS = ["empty rec", "empty idx", "past the end", "between records", "garbage line"]


@pytest.mark.parametrize("backend", ["dali-cpu", "mxnet"])
@pytest.mark.parametrize("kind", KINDS)
def test_index_checked_against_the_file_before_any_pipeline(kind, backend, tmp_path, good):
    rec, idx, words = bad_files(kind, tmp_path, *good)
    for split in ("train", "val"):
        args = train.parse_args(
            ["--data-backend", backend, f"--data-{split}", rec, f"--data-{split}-idx", idx, "--batch-size", "8",
             "--image-shape", "3,32,32"])
        with pytest.raises(protocol.DataError) as error:
            loaders.get_data_iterators(train_config.from_args(args), 0, 1, 0, 1, mx.cpu())
        message = str(error.value)
        assert words in message and "tools/check_dataset.py" in message and "--fix" in message, message
        assert "\n" not in message


def test_the_same_files_are_what_dali_and_mxnet_reject(tmp_path, good):
    """The check is not stricter than the readers: on a healthy file both read every record; on an index that
    points past the end DALI's own reader fails (a C++ error), which is what the check stops first."""
    from nvidia.dali import fn, pipeline_def

    @pipeline_def
    def read(rec, idx):
        jpegs, labels = fn.readers.mxnet(path=[rec], index_path=[idx])
        return jpegs, labels

    rec, idx = good
    assert len(records.RecordFile(rec, idx)) == 24
    pipe = read(rec, idx, batch_size=24, num_threads=1, device_id=None)
    pipe.build()
    assert len(pipe.run()[0]) == 24
    rec, idx, _ = bad_files("past the end", tmp_path, rec, idx)
    with pytest.raises(RuntimeError, match="Incomplete or corrupted record files"):
        pipe = read(rec, idx, batch_size=25, num_threads=1, device_id=None)
        pipe.build()
        pipe.run()


def run_train(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], env=venv_env(),
                          capture_output=True, text=True, timeout=HANG_S)


def train_args(rec, idx, workspace, *extra):
    return ["--data-backend", "dali-cpu", "--dali-threads", "1", "--data-train", rec, "--data-train-idx", idx,
            "--num-layers", "18", "--num-classes", "3", "--image-shape", "3,32,32", "--batch-size", "8",
            "--num-epochs", "1", "--workspace", str(workspace), *extra]


def assert_one_error_line(result, *words):
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("train.py: error:"), result.stderr[-3000:]
    for word in words:
        assert word in errors[0], errors[0]


def test_train_stops_at_a_dangling_index_in_one_line(tmp_path, good):
    rec, idx, _ = bad_files("past the end", tmp_path, *good)
    result = run_train(*train_args(rec, idx, tmp_path / "ws"))
    assert_one_error_line(result, "past the end", "check_dataset.py")
    assert not (tmp_path / "ws" / "model-0001.params").exists()


def undecodable_file(tmp_path, bad_key=13, count=40):
    """A healthy file but for record ``bad_key``, whose image bytes are noise."""
    writer = recordio.MXIndexedRecordIO(str(tmp_path / "bad.idx"), str(tmp_path / "bad.rec"), "w")
    for i, image in enumerate(images(count)):
        data_bytes = cv2.imencode(".jpg", image)[1].tobytes() if i != bad_key else np.random.RandomState(1).bytes(900)
        writer.write_idx(i, recordio.pack(recordio.IRHeader(0, float(i % 3), i, 0), data_bytes))
    writer.close()
    return str(tmp_path / "bad.rec"), str(tmp_path / "bad.idx")


def test_train_names_the_record_that_does_not_decode(tmp_path):
    rec, idx = undecodable_file(tmp_path)
    result = run_train(*train_args(rec, idx, tmp_path / "ws", "--seed", "1"))
    assert_one_error_line(result, f"{rec} record 13 ", "does not decode", "check_dataset.py")


@pytest.mark.parametrize("backend,split", [("dali-cpu", "train"), ("dali-cpu", "val"), ("mxnet", "train")])
def test_iterators_name_the_record_that_does_not_decode(tmp_path, backend, split):
    # (The mxnet backend's validation iterator is left out: MXNet's ImageRecordIter with resize= dies of a
    # floating point exception in C++ on such an image, before Python can report anything.)
    rec, idx = undecodable_file(tmp_path)
    args = train.parse_args(
        ["--data-backend", backend, f"--data-{split}", rec, f"--data-{split}-idx", idx, "--batch-size", "8",
         "--image-shape", "3,32,32", "--data-val-resize", "32", "--dali-threads", "1", "--data-mxnet-threads", "1"])
    with pytest.raises(protocol.DataError) as error:  # ImageRecordIter decodes its first batch when it is made
        iterators = loaders.get_data_iterators(train_config.from_args(args), 0, 1, 0, 1, mx.cpu())
        iterator = iterators[0 if split == "train" else 1]
        for _ in iterator:
            pass
    assert str(error.value).startswith(f"{rec} record 13 (byte ") and "does not decode" in str(error.value)


def test_model_prefix_in_a_new_folder(tmp_path):
    workspace = tmp_path / "ws"
    result = run_train("--data-backend", "synthetic", "--num-layers", "18", "--num-classes", "3", "--image-shape",
                       "3,32,32", "--batch-size", "8", "--num-examples", "16", "--num-epochs", "1", "--workspace",
                       str(workspace), "--model-prefix", "runs/first/model")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (workspace / "runs" / "first" / "model-0001.params").is_file()


# --- tools/check_dataset.py -----------------------------------------------------------------------------

def record_set(rec, idx):
    reader = recordio.MXIndexedRecordIO(idx, rec, "r")
    return sorted(reader.read_idx(key) for key in reader.keys)


def test_label_order_is_a_warning_and_fix_writes_a_shuffled_clean_copy(tmp_path, digits_data):
    digits = records.RecordFile(str(digits_data / "val.rec"), str(digits_data / "val.idx"))
    order = np.argsort(digits.labels, kind="stable")
    rec, idx = write_record_file(str(tmp_path / "sorted"), [cv2.imdecode(digits.image(i), cv2.IMREAD_COLOR)
                                                           for i in order], digits.labels[order])
    result = run_tool(rec, "--num-classes", "10", "--jobs", "1")
    assert result.returncode == 0, result.stdout  # a warning, not an error
    warning = [line for line in result.stdout.splitlines() if line.startswith("warning: label order:")]
    assert len(warning) == 1 and "--fix" in warning[0] and "shard" in warning[0], result.stdout

    fixed = str(tmp_path / "shuffled.rec")
    result = run_tool(rec, "--num-classes", "10", "--jobs", "1", "--fix", fixed)
    assert result.returncode == 0, result.stdout
    assert "shuffled" in result.stdout and "the fixed copy is clean" in result.stdout
    fixed_idx = str(tmp_path / "shuffled.idx")
    assert record_set(fixed, fixed_idx) == record_set(rec, idx)  # the same records, byte for byte
    assert not records.label_runs(records.RecordFile(fixed, fixed_idx).labels)["ordered"]
    again = run_tool(fixed, "--num-classes", "10", "--jobs", "1")
    assert again.returncode == 0 and "label order" not in again.stdout, again.stdout


def test_fix_of_a_file_with_errors_exits_0_when_the_copy_is_clean(tmp_path, good):
    rec, idx = undecodable_file(tmp_path)
    assert run_tool(rec).returncode == 1
    result = run_tool(rec, "--fix", str(tmp_path / "clean.rec"))
    assert result.returncode == 0, result.stdout
    assert "39 records" in result.stdout and "1 dropped" in result.stdout


def test_checker_calls_an_empty_dataset_an_error(tmp_path):
    open(tmp_path / "empty.rec", "wb").close()
    write_index(str(tmp_path / "empty.idx"), [])
    result = run_tool(str(tmp_path / "empty.rec"))
    assert result.returncode == 1 and "no records" in result.stdout, result.stdout


def test_a_pipeline_error_without_a_named_record_is_still_one_telling_line(tmp_path):
    """When no record can be blamed (here the finder is switched off), the line names DALI's failing operator
    and what it met, not the C++ stack."""
    rec, idx = undecodable_file(tmp_path)
    args = train.parse_args(["--data-backend", "dali-cpu", "--data-train", rec, "--data-train-idx",
                                               idx, "--batch-size", "8", "--image-shape", "3,32,32"])
    iterator = loaders.get_data_iterators(train_config.from_args(args), 0, 1, 0, 1, mx.cpu())[0]
    iterator.failing_record = None
    with pytest.raises(protocol.DataError) as error:
        for _ in iterator:
            pass
    message = str(error.value)
    assert "\n" not in message and "decoders.image_random_crop" in message and "check_dataset.py" in message
