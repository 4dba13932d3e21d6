"""Pack one folder of class folders into train/validation RecordIO for the kit: a stratified, seeded split, MXNet's
im2rec, the class names beside the records.

    python tools/prepare_folder.py ROOT OUT [--val-fraction 0.1] [--seed 0] [--threads N]

ROOT holds <class>/<image> (images in subfolders of a class folder count for that class); labels are the class
folders in sorted (code point) order, 0..N-1, as im2rec and tools/prepare_imagenet.sh number them. Every image is
checked first, as tools/check_dataset.py and --mode pred check one (rn50kit/data/images.py): images that do not
decode, GIFs, truncated JPEGs and empty files are reported by name and left out (listed in OUT/prepare.json too);
PNG, BMP, TIFF, WebP, PPM/PGM and CMYK JPEG images are re-encoded as RGB JPEG (quality --quality), other JPEGs are
packed byte for byte (im2rec --pass-through).
Each class puts round(n * val-fraction) of its n good images (at least 1 when n >= 2, never all of them) in the
validation split, chosen by --seed; both lists are shuffled, so no record file is in label order.

OUT receives train.lst/.rec/.idx, val.lst/.rec/.idx, classes.txt (one class name per line in label order: train.py finds
it beside train.rec and saves the names in its checkpoints) and prepare.json (the split per class, the images left out).
Outputs are written under temporary names and renamed when complete. An OUT that already holds a dataset is refused
(its records would be replaced, and a workspace trained on them would resume on other data): give an empty or new
folder, or --force to rebuild it (the same seed gives the same split).
"""
import argparse
import collections
import json
import math
import multiprocessing
import os
import shutil
import subprocess
import sys

if __name__ == "__main__":  # before the imports a Python it refuses could fail on, one line
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from rn50kit.common import supported
    supported.require_supported_python("prepare_folder")

import cv2
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from rn50kit.data.images import IMAGE_SUFFIXES as IMAGE_EXTENSIONS  # noqa: E402  (--mode pred's too)
from rn50kit.data.images import judge_image_file

LIMITS = (32, 8192, 8.0)  # check_dataset's default size warnings: shorter side, longer side, aspect ratio
MAX_LISTED = 20
DATASET_FILES = ("train.rec", "train.idx", "train.lst", "val.rec", "val.idx", "val.lst", "classes.txt", "prepare.json")


class PrepareError(Exception):
    """A problem with the input tree or the packing: one line for the user."""


def find_images(root):
    """({class name: [relative paths]}, [files that are not images], [images outside class folders]); classes in
    label order (sorted names), paths sorted within each class."""
    classes = collections.defaultdict(list)
    others, loose = [], []
    for path, dirs, files in os.walk(root, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(path, name), root)
            if not name.lower().endswith(IMAGE_EXTENSIONS):
                others.append(rel)
            elif os.sep not in rel:
                loose.append(rel)
            else:
                classes[rel.split(os.sep, 1)[0]].append(rel)
    return dict(sorted(classes.items())), others, loose


def check_image(job):
    """(relative path, errors, warnings, needs re-encoding) for one image, judged as --mode pred and
    tools/check_dataset.py judge one (rn50kit/data/images.py)."""
    root, rel = job
    if "\t" in rel or "\n" in rel or rel != rel.strip():
        return rel, [("unusable name", "tabs, line breaks or surrounding spaces do not survive im2rec's .lst")], \
            [], False
    errors, warnings, info = judge_image_file(os.path.join(root, rel), LIMITS)
    return rel, errors, warnings, info["reencode"]


def check_images(root, paths, jobs):
    work = [(root, rel) for rel in paths]
    if jobs <= 1 or len(work) < 200:
        return [check_image(job) for job in work]
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        return pool.map(check_image, work, chunksize=64)


def split_counts(n, fraction):
    """Validation images of a class of n: round(n * fraction), at least 1 when n >= 2, at most n - 1."""
    if fraction <= 0 or n < 2:
        return 0
    return min(n - 1, max(1, int(math.floor(n * fraction + 0.5))))


def split(classes, fraction, seed):
    """{"train": [(label, rel)], "val": [...]}: per class a seeded choice of its validation images, then each
    split in a seeded random order."""
    rng = np.random.default_rng(seed)
    out = {"train": [], "val": []}
    for label, paths in enumerate(classes.values()):
        order = rng.permutation(len(paths))
        num_val = split_counts(len(paths), fraction)
        out["val"] += [(label, paths[i]) for i in sorted(order[:num_val])]
        out["train"] += [(label, paths[i]) for i in sorted(order[num_val:])]
    for name in out:
        out[name] = [out[name][i] for i in rng.permutation(len(out[name]))]
    return out


def im2rec_path(python):
    try:
        result = subprocess.run([python, "-c", "import os, mxnet; print(os.path.join(os.path.dirname("
                                 "mxnet.__file__), 'tools', 'im2rec.py'))"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        raise PrepareError(f"MXNet is not importable by {python}; run 'make setup' and use .venv/bin/python") from None
    path = result.stdout.strip()
    if not os.path.isfile(path):
        raise PrepareError(f"MXNet's im2rec.py is not at {path}")
    return path


def stage(root, staging, entries, reencode, quality):
    """A tree under ``staging`` with the relative paths of ``entries``: links to the original images, re-encoded
    JPEGs for those that need it (im2rec --pass-through then packs each file as it is)."""
    for _, rel in entries:
        target = os.path.join(staging, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if rel in reencode:
            image = cv2.imdecode(np.fromfile(os.path.join(root, rel), np.uint8), cv2.IMREAD_COLOR)
            ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
            if not ok:
                raise PrepareError(f"{rel}: OpenCV could not re-encode it as JPEG")
            jpeg.tofile(target)
        elif not os.path.lexists(target):
            os.symlink(os.path.abspath(os.path.join(root, rel)), target)


def pack(split_name, entries, out, staging, python, im2rec, threads):
    """Write OUT/<split>.lst and run im2rec into OUT/<split>.rec/.idx (under temporary names, then renamed)."""
    part = os.path.join(out, f"{split_name}.part")
    for suffix in (".lst", ".rec", ".idx"):
        if os.path.exists(part + suffix):
            os.remove(part + suffix)
    with open(part + ".lst", "w") as f:
        for index, (label, rel) in enumerate(entries):
            f.write(f"{index}\t{label}\t{rel.replace(os.sep, '/')}\n")  # im2rec's list: index, label, path
    result = subprocess.run([python, im2rec, "--pass-through", "--num-thread", str(threads), part, staging],
                            capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PrepareError(f"im2rec failed on the {split_name} list: {tail[0]}")
    with open(part + ".idx") as f:
        packed = sum(1 for line in f if line.strip())
    if packed != len(entries):
        raise PrepareError(f"im2rec packed {packed} of the {len(entries)} {split_name} images: "
                           f"{(result.stdout + result.stderr).strip().splitlines()[-1:]}")
    for suffix in (".lst", ".rec", ".idx"):
        os.replace(part + suffix, os.path.join(out, split_name + suffix))


def existing_dataset_problem(out):
    """The one-line refusal of an OUT that already holds a dataset's files (None: nothing there to replace)."""
    held = [name for name in DATASET_FILES if os.path.exists(os.path.join(out, name))]
    if not held:
        return None
    source = ""
    try:
        with open(os.path.join(out, "prepare.json")) as f:
            source = f" (packed from {json.load(f)['root']})"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return (f"{out} already holds a dataset{source}: {', '.join(held[:4])}{' ...' if len(held) > 4 else ''}; "
            f"give an empty or new folder, or pass --force to replace it")


def prepare(root, out, val_fraction=0.1, seed=0, threads=None, jobs=None, quality=95, python=None, log=print,
            force=False):
    """Check, split and pack ``root`` into ``out``; returns the summary written to OUT/prepare.json. ``force``:
    replace a dataset already in ``out`` (refused otherwise)."""
    root, out = os.path.abspath(root), os.path.abspath(out)
    if not os.path.isdir(root):
        raise PrepareError(f"{root} is not a folder; give ROOT/<class>/<image>")
    if not 0 <= val_fraction < 1:
        raise PrepareError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    if out == root or out.startswith(root + os.sep):
        raise PrepareError(f"OUT ({out}) must not be inside ROOT ({root}): its files would be taken for images")
    if not force and existing_dataset_problem(out):
        raise PrepareError(existing_dataset_problem(out))
    classes, others, loose = find_images(root)
    if not classes:
        raise PrepareError(f"{root} has no class folders with images ({', '.join(IMAGE_EXTENSIONS)}); expected "
                           f"{root}/<class>/<image>")
    bad_names = [name for name in classes if name != name.strip() or "\n" in name]
    if bad_names:
        raise PrepareError(f"class folder names with line breaks or surrounding spaces cannot be written one per "
                           f"line in classes.txt: {bad_names[:3]}; rename them")
    jobs = jobs or os.cpu_count() or 1
    checked = check_images(root, [rel for paths in classes.values() for rel in paths], jobs)
    bad = {rel: errors for rel, errors, _, _ in checked if errors}
    reencode = {rel for rel, errors, _, again in checked if again and not errors}
    warned = collections.Counter(kind for rel, errors, warns, _ in checked if not errors for kind, _ in warns)
    good = {name: [rel for rel in paths if rel not in bad] for name, paths in classes.items()}
    empty = [name for name, paths in good.items() if not paths]
    if empty:
        raise PrepareError(f"class folder(s) {', '.join(empty[:5])} have no readable image; remove them or add images "
                           "(labels would otherwise shift)")
    for rel, errors in sorted(bad.items()):
        log(f"bad image, left out: {rel}: " + "; ".join(f"{kind}: {detail}" for kind, detail in errors))
    splits = split(good, val_fraction, seed)
    python = python or sys.executable
    im2rec = im2rec_path(python)
    threads = threads or min(8, os.cpu_count() or 1)
    os.makedirs(out, exist_ok=True)
    staging = os.path.join(out, ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        for name, entries in splits.items():
            if not entries:
                continue
            stage(root, staging, entries, reencode, quality)
            log(f"[{name}] packing {len(entries)} images with im2rec ({threads} thread{'s' if threads > 1 else ''})")
            pack(name, entries, out, staging, python, im2rec, threads)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    names = list(good)
    with open(os.path.join(out, "classes.txt.tmp"), "w") as f:
        f.write("".join(f"{name}\n" for name in names))
    os.replace(os.path.join(out, "classes.txt.tmp"), os.path.join(out, "classes.txt"))
    per_class = {name: {"train": sum(1 for label, _ in splits["train"] if label == i),
                        "val": sum(1 for label, _ in splits["val"] if label == i)} for i, name in enumerate(names)}
    summary = {"root": root, "val_fraction": val_fraction, "seed": seed, "classes": names, "per_class": per_class,
               "train": len(splits["train"]), "val": len(splits["val"]),
               "bad_images": {rel: [f"{kind}: {detail}" for kind, detail in errors]
                              for rel, errors in sorted(bad.items())},
               "reencoded_as_jpeg": len(reencode), "warnings": dict(warned),
               "ignored_files": {"not images": others[:100], "outside class folders": loose[:100]}}
    with open(os.path.join(out, "prepare.json.tmp"), "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(os.path.join(out, "prepare.json.tmp"), os.path.join(out, "prepare.json"))
    if others or loose:
        log(f"ignored: {len(others)} file(s) that are not images ({', '.join(IMAGE_EXTENSIONS)}), {len(loose)} "
            "image(s) outside class folders")
    for name in [n for n, c in per_class.items() if c["val"] == 0 and val_fraction > 0]:
        log(f"warning: class {name} has {per_class[name]['train']} image(s): none left for validation")
    if warned:
        log("notes: " + ", ".join(f"{kind}: {count}" for kind, count in sorted(warned.items())) +
            (f" ({len(reencode)} re-encoded as JPEG)" if reencode else ""))
    log(f"{len(names)} classes; train.rec {summary['train']} images, val.rec {summary['val']} images; "
        f"{len(bad)} bad image(s) left out; class names in {os.path.join(out, 'classes.txt')}")
    return summary


def main(argv=None):
    try:
        from rn50kit.common.helptext import HelpFormatter
    except ImportError:  # helptext is the kit's; keep the tool usable on its own
        HelpFormatter = argparse.HelpFormatter
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter,
                                     epilog="Then: ./runner --data-root OUT --num-classes N (docs/own-images.md)")
    parser.add_argument("root", metavar="ROOT", help="folder of class folders: ROOT/<class>/<image>")
    parser.add_argument("out", metavar="OUT", help="where the record files, classes.txt and prepare.json go")
    parser.add_argument("--val-fraction", type=float, default=0.1,
                        help="share of each class's images for validation (0: no val.rec)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split and of the record order")
    parser.add_argument("--threads", type=int, default=None, help="im2rec threads (default: up to 8 cores)")
    parser.add_argument("--jobs", type=int, default=None, help="processes checking images (default: all cores)")
    parser.add_argument("--quality", type=int, default=95, help="JPEG quality of re-encoded (non-JPEG) images")
    parser.add_argument("--force", action="store_true",
                        help="replace the dataset OUT already holds (refused otherwise)")
    args = parser.parse_args(argv)
    try:
        summary = prepare(args.root, args.out, args.val_fraction, args.seed, args.threads, args.jobs, args.quality,
                          force=args.force)
    except PrepareError as error:
        print(f"prepare_folder.py: error: {error}", file=sys.stderr)
        return 1
    print(f"Dataset prepared in {os.path.abspath(args.out)}: train with --data-root {os.path.abspath(args.out)} "
          f"--num-classes {len(summary['classes'])} (the names in classes.txt go into the checkpoints)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
