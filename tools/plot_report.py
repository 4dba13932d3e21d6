#!/usr/bin/env python3
"""Plot a training report: top-1, top-5, loss and LR per epoch, train and val, and the per-class results, as PNG files.

    python tools/plot_report.py REPORT.json [--out DIR]

Writes DIR/<report name>-{top1,top5,loss,lr}.png (DIR: beside the report) for every curve the report holds, and
DIR/<report name>-confusion.png when it holds per-class results (the latest validation's confusion matrix; for
many classes, the most confused pairs), as train.py draws it.
"""
import argparse
import json
import os
import sys

if __name__ == "__main__":  # before the imports a Python it refuses could fail on, one line
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from rn50kit.common import supported
    supported.require_supported_python("plot_report")

KIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":  # under a Python without matplotlib: the kit's, as runner does
    sys.path.insert(0, KIT_DIR)
    from rn50kit.config import cli
    cli.rerun_under_chosen_python(os.path.abspath(__file__), "plot_report.py", KIT_DIR)

CURVES = [("top1", "top-1 accuracy"), ("top5", "top-5 accuracy"), ("loss", "loss"), ("lr", "learning rate")]


def plot(report_path, out_dir=None):
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    with open(report_path) as f:
        raw = json.load(f)
    metrics = raw["metrics"]
    out_dir = out_dir or os.path.dirname(os.path.abspath(report_path))
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(report_path))[0]
    written = []
    for key, label in CURVES:
        series = {mode: metrics[f"{mode}.{key}"] for mode in ("train", "val") if metrics.get(f"{mode}.{key}")}
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for mode, values in series.items():
            ax.plot(range(1, len(values) + 1), values, marker="o", markersize=3, label=mode)
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend()
        path = os.path.join(out_dir, f"{stem}-{key}.png")
        fig.tight_layout()
        fig.savefig(path + ".tmp.png", dpi=100)
        plt.close(fig)
        os.replace(path + ".tmp.png", path)
        written.append(path)
    if raw.get("per_class"):
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # report.py
        from rn50kit.reporting import report
        written.append(report.save_confusion_png(raw["per_class"], os.path.join(out_dir, f"{stem}-confusion.png")))
    return written


def main():
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # helptext
    from rn50kit.common.helptext import HelpFormatter
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument("report", help="report JSON written by train.py --report")
    parser.add_argument("--out", default=None, help="output directory (default: beside the report)")
    args = parser.parse_args()
    try:
        written = plot(args.report, args.out)
    except (OSError, ValueError, KeyError) as error:
        print(f"plot_report.py: error: cannot read {args.report}: {error}", file=sys.stderr)
        sys.exit(2)
    if not written:
        print(f"plot_report.py: error: {args.report} holds no top1/top5/loss/lr curves nor per-class results",
              file=sys.stderr)
        sys.exit(2)
    print("\n".join(written))


if __name__ == "__main__":
    main()
