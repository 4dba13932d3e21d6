#!/usr/bin/env bash
# Pack an image folder tree into RecordIO for the kit, with MXNet's own im2rec.py.
#
#   tools/prepare_imagenet.sh RAW_DIR OUT_DIR
#
# RAW_DIR holds train/<class>/*.JPEG and val/<class>/*.JPEG (the validation set in class folders too, see
# README). OUT_DIR receives train.lst/.rec/.idx and val.lst/.rec/.idx. Images are stored as they are
# (--pass-through): no re-encoding. Labels are the sorted class-folder names, 0..N-1.
# Each step stops the script on failure; a rerun redoes the steps whose outputs are missing or older.
set -euo pipefail

usage() { echo "usage: $0 RAW_DIR OUT_DIR   (RAW_DIR must contain train/ and val/ class folders)" >&2; exit 2; }
[ $# -eq 2 ] || usage
RAW=$(realpath -- "$1" 2>/dev/null) || { echo "error: $1 does not exist" >&2; usage; }
OUT=$2
for split in train val; do
    [ -d "$RAW/$split" ] || { echo "error: $RAW/$split is missing; expected $RAW/$split/<class>/<image>" >&2; exit 1; }
done
PYTHON=${PYTHON:-python}
IM2REC=$("$PYTHON" -c 'import os, mxnet; print(os.path.join(os.path.dirname(mxnet.__file__), "tools", "im2rec.py"))') \
    || { echo "error: MXNet is not importable by $PYTHON; run 'make setup' and use .venv/bin/python" >&2; exit 1; }
THREADS=${THREADS:-$(nproc)}
mkdir -p "$OUT"
cd "$OUT"

for split in train val; do
    if [ ! -s "$split.lst" ]; then
        echo "[$split] listing $RAW/$split"
        "$PYTHON" "$IM2REC" --list --recursive "$split.tmp" "$RAW/$split"
        mv "$split.tmp.lst" "$split.lst"
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
