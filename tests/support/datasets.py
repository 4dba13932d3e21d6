"""Small real datasets: RecordIO files written with MXNet's recordio, photos and folders of them, the demo digits
(made once per test run, shared by pytest-xdist's workers), and tools/check_dataset.py on planted faults."""
import contextlib
import fcntl
import os
import shutil
import subprocess
import sys

import cv2
import numpy as np

from .processes import ROOT, venv_env

CHECK_DATASET = os.path.join(ROOT, "tools", "check_dataset.py")


def write_record_file(prefix, images, labels, quality=95):
    """Pack BGR uint8 images with float labels into prefix.rec/.idx with MXNet's recordio."""
    from mxnet import recordio
    record = recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    for i, (image, label) in enumerate(zip(images, labels)):
        ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
        assert ok
        header = recordio.IRHeader(0, float(label), i, 0)
        record.write_idx(i, recordio.pack(header, jpeg.tobytes()))
    record.close()
    return prefix + ".rec", prefix + ".idx"


def write_payloads(prefix, payloads):
    """payloads: list of (label, image bytes); returns the .rec/.idx paths."""
    from mxnet import recordio
    writer = recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    for i, (label, data) in enumerate(payloads):
        writer.write_idx(i, recordio.pack(recordio.IRHeader(0, label, i, 0), data))
    writer.close()
    return prefix + ".rec", prefix + ".idx"


def empty_records(folder):
    """train/val .rec and .idx, empty: a data root whose files are only looked at, never read."""
    for name in ("train.rec", "train.idx", "val.rec", "val.idx"):
        (folder / name).write_bytes(b"")
    return folder


@contextlib.contextmanager
def made_once(tmp_path_factory, name):
    """A folder for data made once per test run and only read after. Yields (folder, whether it still has to be
    made); under pytest-xdist every worker gets the same folder (beside their own base folders), the first makes
    it while the others wait on a lock."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # pytest-N/: the run's folder, shared by its workers (popen-gw0, popen-gw1, ...)
    out, done = base / name, base / f"{name}.done"
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)  # a worker that failed halfway left it
            out.mkdir()
            yield out, True
            done.touch()
        else:
            yield out, False


def make_digits(out):
    """The demo dataset (real digit scans), built in ``out`` through tools/make_demo_data.py and im2rec."""
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_demo_data.py"), str(out)],
                   check=True, env=venv_env(), stdout=subprocess.DEVNULL)


UNIQUE_COUNT = 53  # prime: never a multiple of the batch or of the number of shards


def unique_label_records(out):
    """val.rec/.idx in ``out`` whose labels are the record numbers, so each sample can be told apart."""
    rng = np.random.RandomState(0)
    images = [rng.randint(0, 255, size=(20 + i % 7, 24, 3), dtype=np.uint8) for i in range(UNIQUE_COUNT)]
    return write_record_file(str(out / "val"), images, range(UNIQUE_COUNT))


# --- a record file stored in label order (unit/test_records, e2e/test_data_pipelines) -----------------------------

NUM_RECORDS, NUM_CLASSES = 64, 4


def sorted_records(out):
    """64 small JPEGs stored in label order; each record's label is its own number (so records can be told
    apart after the pipeline), its class is label // 16."""
    rng = np.random.RandomState(0)
    images = [rng.randint(0, 255, size=(20 + i % 5, 24, 3), dtype=np.uint8) for i in range(NUM_RECORDS)]
    return write_record_file(str(out / "train"), images, range(NUM_RECORDS))


def labelled_records(folder, labels):
    """train.rec/.idx and val.rec/.idx with the given labels and no .lst (as check_dataset.py --fix writes)."""
    rng = np.random.RandomState(0)
    images = [rng.randint(0, 255, size=(8, 8, 3), dtype=np.uint8) for _ in labels]
    files = {}
    for split in ("train", "val"):
        files[split] = write_record_file(str(folder / split), images, labels)
    assert not list(folder.glob("*.lst"))
    return files


# --- photos ------------------------------------------------------------------------------------------------------

def photo(seed, shape=(60, 80)):
    rng = np.random.RandomState(seed)
    small = rng.randint(0, 255, size=(6, 8, 3), dtype=np.uint8)
    return cv2.resize(small, shape[::-1], interpolation=cv2.INTER_CUBIC)


def jpeg(image, quality=90):
    return cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])[1].tobytes()


def photo_folder(root):
    """7 images in nested folders (mixed sizes, a grayscale JPEG, PNGs), a corrupt .jpg and a text file."""
    rng = np.random.RandomState(0)
    (root / "a" / "deep").mkdir(parents=True)
    (root / "b").mkdir()
    for name, shape in [("a/1.jpg", (40, 60, 3)), ("a/deep/2.png", (90, 33, 3)), ("b/3.jpg", (32, 32, 3)),
                        ("b/4.jpeg", (120, 80, 3)), ("5.png", (50, 50, 3)), ("a/6.JPG", (35, 70, 3))]:
        cv2.imwrite(str(root / name), rng.randint(0, 255, shape, dtype=np.uint8))
    cv2.imwrite(str(root / "b" / "gray.jpg"), rng.randint(0, 255, (45, 64), dtype=np.uint8))
    (root / "a" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (root / "notes.txt").write_text("not an image\n")
    return root


# --- tools/check_dataset.py on planted faults (unit/test_check_dataset, e2e/test_dataset_check, test_bad_data) ----

def run_tool(*args):
    """tools/check_dataset.py with ``args``."""
    return subprocess.run([sys.executable, CHECK_DATASET, *args], capture_output=True, text=True, env=venv_env())


def planted_records(out):
    """planted.rec/.idx in ``out``: healthy records and one of each fault check_dataset.py finds (EXPECTED_ERRORS,
    by record number; 5, 8 and 9 are warnings)."""
    good = jpeg(photo(0))
    payloads = [
        (0, good),                                             # 0 healthy
        (1, jpeg(photo(1))),                                   # 1 healthy
        (2, good[:len(good) // 2]),                            # 2 truncated
        (3, np.random.RandomState(3).bytes(500)),              # 3 garbage
        (4, b""),                                              # 4 empty payload
        (5, cv2.imencode(".png", photo(5))[1].tobytes()),      # 5 PNG (warning, re-encoded by --fix)
        (3.5, jpeg(photo(6))),                                 # 6 label not an integer
        (42, jpeg(photo(7))),                                  # 7 label out of range for 10 classes
        (8, jpeg(cv2.cvtColor(photo(8), cv2.COLOR_BGR2GRAY))),  # 8 grayscale JPEG (warning)
        (9, jpeg(photo(9, (20, 400)))),                        # 9 unusual size (warning)
    ]
    rec, idx = write_payloads(str(out / "planted"), payloads)
    size = os.path.getsize(rec)
    with open(idx) as f:
        first_offset = int(f.readline().split()[1])
    with open(idx, "a") as f:
        f.write(f"10\t{size + 1000}\n")          # 10 dangling: past the end of the file
        f.write(f"11\t{first_offset + 4}\n")     # 11 into the middle of record 0: does not parse
    return rec, idx


EXPECTED_ERRORS = {2: "truncated image", 3: "undecodable image", 4: "empty payload", 6: "bad label",
                   7: "bad label", 10: "dangling index entry", 11: "unreadable record"}
