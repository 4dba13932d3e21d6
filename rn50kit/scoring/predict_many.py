"""--mode pred over many images: --data-pred as a folder (searched recursively), a glob or a list file; the images
go through the validation transform in batches, and the top-k classes of each go to a CSV or JSON file, one row
per image in the order found. An image that cannot be read gets a row naming the error (and a warning); the others
go on. A single image file without --pred-out keeps predict.py's printed top-5."""
import csv
import glob
import json
import logging
import os
import time
import zlib

import numpy as np

from rn50kit.data import images
from rn50kit.reporting.progress import Progress
from rn50kit.scoring import predict

log = logging.getLogger("rn50")

IMAGE_SUFFIXES = images.IMAGE_SUFFIXES  # tools/prepare_folder.py's: a GIF gets a row saying why it is refused
DEFAULT_OUT = "predictions.csv"


class NoImages(Exception):
    """--data-pred names no image: reported as one line."""


def is_image_name(path):
    return path.lower().endswith(IMAGE_SUFFIXES)


def is_many(data_pred):
    """Whether --data-pred names many images (a folder, a glob, a list file) rather than one image file."""
    return os.path.isdir(data_pred) or (not os.path.isfile(data_pred) and predict.is_glob(data_pred)) or \
        data_pred.lower().endswith(predict.LIST_SUFFIXES)


def listed_paths(list_file):
    """The paths of a list file, one per line (blank lines and # comments skipped), relative ones to its folder."""
    folder = os.path.dirname(list_file)
    with open(list_file) as f:
        lines = [line.strip() for line in f]
    return [os.path.join(folder, line) for line in lines if line and not line.startswith("#")]


def image_paths(data_pred):
    """The images --data-pred names, in a stable order: a folder's images (by name, subfolders too), a glob's
    matches that are files (sorted), a list file's lines as they come (each listed path kept, readable or not:
    a missing one gets its error row), or the one file."""
    if os.path.isdir(data_pred):
        found = [os.path.join(root, name) for root, _, names in os.walk(data_pred) for name in names
                 if is_image_name(name)]
        paths = sorted(found)
    elif os.path.isfile(data_pred) and data_pred.lower().endswith(predict.LIST_SUFFIXES):
        paths = listed_paths(data_pred)
    elif os.path.isfile(data_pred):
        paths = [data_pred]
    else:
        paths = sorted(path for path in glob.glob(data_pred, recursive=True) if os.path.isfile(path))
    if not paths:
        raise NoImages(f"--data-pred {data_pred} names no image (looked for {', '.join(IMAGE_SUFFIXES)} files)")
    return paths


def loaded(paths, transform):
    """(path, image or None, error or None) for each path: ``transform(path)`` a load_image batch of one."""
    for path in paths:
        try:
            yield path, transform(path)[0], None
        except predict.PredictionError as error:  # the reason rn50kit/data/images.py gives, as the packer does
            yield path, None, error.reason
        except OSError as error:
            yield path, None, error.strerror or str(error)


def predict_all(score, paths, transform, batch_size, top, names, progress=None):
    """Rows {"path", "error", "top": [(probability, index, name)]} for ``paths``, in order: ``transform(path)``
    loads an image (a batch of one), ``score(images)`` gives a batch's probabilities. Unreadable images get their
    error and a warning."""
    rows, batch, started = [], [], time.time()

    def flush():
        if batch:
            probs = score(np.stack([image for _, image in batch]))
            for (row, _), image_probs in zip(batch, probs):
                row["top"] = predict.top_classes(image_probs, names, top)
            batch.clear()
        if progress is not None:
            done = len(rows)
            speed = done / max(time.time() - started, 1e-9)
            progress.count("Predict", done, len(paths), speed, (len(paths) - done) / max(speed, 1e-9))

    for path, image, error in loaded(paths, transform):
        row = {"path": path, "error": error, "top": []}
        rows.append(row)
        if error:
            log.warning("--data-pred: %s: %s; left out", path, error)
            continue
        batch.append((row, image))
        if len(batch) == batch_size:
            flush()
    flush()
    if progress is not None:
        progress.end_epoch()
    return rows


def write_rows(rows, path, top):
    """The rows as CSV (path, error, name_1, probability_1, ...) or JSON (a list of {"path", "error", "top":
    [{"name", "class", "probability"}]}) by ``path``'s suffix; written whole, then renamed over ``path``."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", newline="") as f:
        if path.lower().endswith(".json"):
            json.dump([{"path": row["path"], "error": row["error"],
                        "top": [{"name": name, "class": index, "probability": probability}
                                for probability, index, name in row["top"]]} for row in rows], f, indent=1)
        else:
            writer = csv.writer(f)
            writer.writerow(["path", "error"] + [f"{what}_{rank}" for rank in range(1, top + 1)
                                                 for what in ("name", "probability")])
            for row in rows:
                cells = [cell for probability, _, name in row["top"] for cell in (name, repr(probability))]
                writer.writerow([row["path"], row["error"] or ""] + cells + [""] * (2 * top - len(cells)))
    os.replace(tmp, path)


def run(score, data_pred, transform, batch_size, top, names, out_path, every, dist=None):
    """Predict every image --data-pred names and write them to ``out_path``; returns the rows. Progress (a bar on
    a terminal, else a line every ``every`` batches) shows images/s and the ETA. With several workers (``dist``, a
    Distributed) each predicts its share of the images (consecutive ones) at its share of ``batch_size``, and rank
    0 writes every row, in the order found."""
    paths = image_paths(data_pred)
    rank, size = (0, 1) if dist is None else (dist.rank, dist.size)
    if size > 1:
        check_same_images(paths, data_pred, dist)
    if rank == 0:
        log.info("Predicting %d image(s) from %s into %s%s", len(paths), data_pred, out_path,
                 f" ({size} workers)" if size > 1 else "")
    share = paths[len(paths) * rank // size:len(paths) * (rank + 1) // size]
    batch_size = max(batch_size // size, 1)
    progress = Progress(True, 1) if rank == 0 and len(share) > batch_size else None
    if progress is not None and not progress.tty:
        progress = ThinnedProgress(progress, every)
    rows = predict_all(score, share, transform, batch_size, top, names, progress)
    if size > 1:
        rows = [row for part in dist.gather_json(rows, "pred.rows") for row in part]
    if rank != 0:
        return rows
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    write_rows(rows, out_path, top)
    failed = sum(1 for row in rows if row["error"])
    log.info("Wrote %d prediction(s) to %s%s", len(rows) - failed, out_path,
             f"; {failed} image(s) could not be read (their rows name why)" if failed else "")
    return rows


def check_same_images(paths, data_pred, dist):
    """Every worker must see the same images, or the shares would leave some out and repeat others (NoImages on
    every rank alike, from the counts every rank gathers)."""
    seen = dist.gather([len(paths), zlib.crc32("\n".join(paths).encode())], "pred.images")
    if any(other != seen[0] for other in seen):
        counts = ", ".join(f"rank {rank}: {int(count)}" for rank, (count, _) in enumerate(seen))
        raise NoImages(f"--data-pred {data_pred} names other images on different workers ({counts} images): give "
                       "every worker the same files (a shared folder)")


class ThinnedProgress:
    """A Progress written to a log only every ``every`` calls (and at the last item): log lines, not a bar."""

    def __init__(self, progress, every):
        self.progress, self.every, self.calls = progress, max(every or 1, 1), 0

    def count(self, label, done, total, speed, eta_seconds):
        self.calls += 1
        if self.calls % self.every == 0 or done == total:
            self.progress.count(label, done, total, speed, eta_seconds)

    def end_epoch(self):
        self.progress.end_epoch()
