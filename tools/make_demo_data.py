"""Build the demo dataset: scikit-learn's handwritten digits as JPEG class folders, packed as RecordIO.

    python tools/make_demo_data.py OUT_DIR

Writes OUT_DIR/raw/{train,val}/<digit>/*.jpg (1797 real 8x8 scans, upscaled to --size pixels, in colour
so the pipelines see ordinary RGB JPEGs), then runs tools/prepare_imagenet.sh OUT_DIR/raw OUT_DIR, the same
preparation path as ImageNet. Nothing is downloaded. A rerun with the data present does nothing.
"""
import argparse
import os
import subprocess
import sys

if __name__ == "__main__":  # before the imports a Python it refuses could fail on, one line
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from rn50kit.common import supported
    supported.require_supported_python("make_demo_data")

import cv2
import numpy as np
from sklearn.datasets import load_digits

HERE = os.path.dirname(os.path.abspath(__file__))


def write_images(out_dir, size, val_fraction, seed):
    digits = load_digits()
    rng = np.random.RandomState(seed)
    order = rng.permutation(len(digits.target))
    num_val = int(round(len(order) * val_fraction))
    splits = {"val": order[:num_val], "train": order[num_val:]}
    for split, indices in splits.items():
        for i in indices:
            label = int(digits.target[i])
            folder = os.path.join(out_dir, split, f"{label}")
            os.makedirs(folder, exist_ok=True)
            gray = (digits.images[i] * (255.0 / 16.0)).astype(np.uint8)  # pixel values are 0..16
            gray = cv2.resize(gray, (size, size), interpolation=cv2.INTER_CUBIC)
            image = cv2.cvtColor(255 - gray, cv2.COLOR_GRAY2BGR)  # dark ink on white paper
            cv2.imwrite(os.path.join(folder, f"{i:04d}.jpg"), image, [cv2.IMWRITE_JPEG_QUALITY, 95])
    return {split: len(indices) for split, indices in splits.items()}


def main():
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # helptext
    from rn50kit.common.helptext import HelpFormatter
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument("out_dir", help="output directory")
    parser.add_argument("--size", type=int, default=32, help="image side in pixels")
    parser.add_argument("--val-fraction", type=float, default=0.2, help="share of images held out for validation")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/val split")
    args = parser.parse_args()
    if all(os.path.isfile(os.path.join(args.out_dir, f)) for f in ("train.rec", "train.idx", "val.rec", "val.idx")):
        print(f"Demo dataset already in {args.out_dir}")
        return
    raw = os.path.join(args.out_dir, "raw")
    if not os.path.isdir(raw):
        tmp = raw + ".tmp"
        counts = write_images(tmp, args.size, args.val_fraction, args.seed)
        os.replace(tmp, raw)
        print(f"Wrote {counts['train']} training and {counts['val']} validation images to {raw}")
    env = dict(os.environ, PYTHON=sys.executable)
    subprocess.run([os.path.join(HERE, "prepare_imagenet.sh"), raw, args.out_dir], check=True, env=env)


if __name__ == "__main__":
    main()
