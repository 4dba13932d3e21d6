#!/usr/bin/env bash
# Pack an image folder tree into RecordIO for the kit, with MXNet's own im2rec.py.
#
#   tools/prepare_imagenet.sh RAW_DIR OUT_DIR
#
# RAW_DIR holds train/<class>/*.JPEG and val/<class>/*.JPEG (the validation set in class folders too, see
# docs/data.md). OUT_DIR receives train.lst/.rec/.idx and val.lst/.rec/.idx. Images are stored as they are
# (--pass-through): no re-encoding. Labels are the sorted class-folder names, 0..N-1.
# Each step stops the script on failure; a rerun redoes the steps whose outputs are missing or older, and lists
# and packs a split again when its raw tree changed (images added, removed or replaced).
set -euo pipefail

usage() { echo "usage: $0 RAW_DIR OUT_DIR   (RAW_DIR must contain train/ and val/ class folders)" >&2; exit 2; }
[ $# -eq 2 ] || usage
RAW=$(realpath -- "$1" 2>/dev/null) || { echo "error: $1 does not exist" >&2; usage; }
OUT=$2
for split in train val; do
    [ -d "$RAW/$split" ] || { echo "error: $RAW/$split is missing; expected $RAW/$split/<class>/<image>" >&2; exit 1; }
done
# im2rec numbers the class folders of each split on its own (sorted names -> 0..N-1): if val/ lacks a class
# or has an extra one, every later validation label would silently mean another class.
# Only folders holding images count (im2rec skips empty ones), compared in im2rec's (code point) order.
classes() {
    find "$1" -mindepth 2 -type f \( -iname '*.jpg' -o -iname '*.jpeg' -o -iname '*.png' \) -printf '%P\n' \
        | sed 's|/[^/]*$||' | LC_ALL=C sort -u
}
TRAIN_CLASSES=$(classes "$RAW/train")
VAL_CLASSES=$(classes "$RAW/val")
[ -n "$TRAIN_CLASSES" ] || { echo "error: $RAW/train has no class folders with images" >&2; exit 1; }
# ImageNet's ILSVRC2012_img_val.tar unpacks flat: 50,000 images in val/ itself, no class folders.
FLAT_VAL=$(find "$RAW/val" -maxdepth 1 -type f \( -iname '*.jpg' -o -iname '*.jpeg' -o -iname '*.png' \) | wc -l)
if [ -z "$VAL_CLASSES" ] && [ "$FLAT_VAL" -gt 0 ]; then
    echo "error: $RAW/val holds $FLAT_VAL images directly, not in class folders (ImageNet's" \
         "ILSVRC2012_img_val.tar unpacks flat): sort them into the training class folders first, e.g. with the" \
         "widely used valprep.sh (cd $RAW/val && bash valprep.sh), then rerun" >&2
    exit 1
fi
if [ "$TRAIN_CLASSES" != "$VAL_CLASSES" ]; then
    echo "error: the class folders with images in $RAW/train and $RAW/val differ, so their labels would" \
         "not match (put the validation images in the same class folders, see docs/data.md); first differences:" >&2
    diff <(echo "$TRAIN_CLASSES") <(echo "$VAL_CLASSES") | grep '^[<>]' | head -5 >&2 || true
    exit 1
fi
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "${PYTHON:-}" ]; then  # the kit's .venv when there is one, so the script works without activating it
    if [ -x "$KIT/.venv/bin/python" ]; then PYTHON=$KIT/.venv/bin/python; else PYTHON=python; fi
fi
IM2REC=$("$PYTHON" -c 'import os, mxnet; print(os.path.join(os.path.dirname(mxnet.__file__), "tools", "im2rec.py"))' \
         2>/dev/null) \
    || { echo "error: MXNet is not importable by $PYTHON; run 'make setup' and use .venv/bin/python" >&2; exit 1; }
THREADS=${THREADS:-$(nproc)}
mkdir -p "$OUT"
cd "$OUT"

# What a listing was made from (every image's path, size and time): a changed raw tree (images added, removed or
# replaced) is listed and packed again on a rerun, not reported with the old counts.
tree_state() {
    find "$1" -mindepth 1 -type f -printf '%P %s %T@\n' | LC_ALL=C sort | md5sum | cut -d' ' -f1
}
for split in train val; do
    STATE=$(tree_state "$RAW/$split")
    if [ -s "$split.lst" ] && [ "$(cat "$split.tree" 2>/dev/null)" != "$STATE" ]; then
        echo "[$split] $RAW/$split changed since $split.lst was listed: listing and packing it again"
        rm -f "$split.lst"
    fi
    if [ ! -s "$split.lst" ]; then
        echo "[$split] listing $RAW/$split (im2rec's class list: $split.list.log)"
        "$PYTHON" "$IM2REC" --list --recursive "$split.tmp" "$RAW/$split" > "$split.list.log"
        mv "$split.tmp.lst" "$split.lst"
        echo "$STATE" > "$split.tree"
    fi
    if [ ! -s "$split.idx" ] || [ "$split.lst" -nt "$split.idx" ]; then
        echo "[$split] packing $(wc -l < "$split.lst") images with $THREADS threads"
        rm -f "$split.rec" "$split.idx"
        # im2rec names its outputs after the list; write under a temporary name, rename when complete.
        ln -sf "$split.lst" "$split.part.lst"
        "$PYTHON" "$IM2REC" --pass-through --num-thread "$THREADS" "$split.part" "$RAW/$split"
        rm -f "$split.part.lst"
        mv "$split.part.rec" "$split.rec"
        mv "$split.part.idx" "$split.idx"
    fi
done
echo "Dataset was prepared successfully in $(pwd): train.rec ($(wc -l < train.idx) records), val.rec ($(wc -l < val.idx) records)"
