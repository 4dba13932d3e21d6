"""The JSON report of a run, in the original kit's `--report` format.

{"model", "ngpus", "total_duration", "cmd", "metrics": {"train.loss": [one value per epoch], ...}}, and for
--mode val "weights" (the .params scored, or "fresh"). Accuracies are fractions; latencies are seconds per
iteration; total_ips is images/s over all workers; timed_iters is how many iterations those come from, after the
epoch's first "untimed_iters" (train.py --untimed-iters, WARMUP_ITERATIONS by default); steady_after is after how
many of those untimed ones the step time was steady, up to the last of them (rn50kit/common/steady.py), null if it
was not at their end (the timed ones then are not a steady state's).

"per_class" holds the latest validation's results per class (exact over all workers; see per_class_results):
{"epoch", "classes": names (or class indices as strings), "samples", "correct", "top1" (per class; null for a
class without validation samples), "confusion" (rows: true class, columns: predicted class; up to
DENSE_CONFUSION_MAX classes, else null), "confused_pairs" (every off-diagonal cell that is not zero, as [true,
predicted, count], most frequent first: with "correct" on the diagonal, the whole matrix for any number of
classes)}.
"""
import json
import os
from collections import OrderedDict

import numpy as np

from rn50kit.common import steady

LATENCY_PERCENTILES = [50, 90, 95, 99, 100]
DENSE_CONFUSION_MAX = 100  # classes up to which the report holds the whole confusion matrix as rows
PNG_MATRIX_MAX = 40  # classes up to which the PNG draws the matrix; above, the most confused pairs
PNG_PAIRS = 30  # pairs drawn for many classes
WARMUP_ITERATIONS = 20  # by default the first iterations (graph building, caches) do not count towards speed


def write_json(path, value, indent=4):
    """Write ``value`` to ``path`` atomically (a temporary file renamed over it): a reader, or a run stopped in the
    middle, never sees half a file. An OSError (a full disk) names ``path``, and no part is left."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(value, f, indent=indent)
        os.replace(tmp, path)
    except OSError as error:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise OSError(error.errno, error.strerror, path) from error


def timed(durations, untimed=WARMUP_ITERATIONS):
    """The step durations that count towards speed: all but the first ``untimed`` when there are more."""
    durations = list(durations)
    return durations[untimed:] if len(durations) > untimed else durations


def images_per_second(durations, batch_size, untimed=WARMUP_ITERATIONS):
    """An epoch's images/s as the report gives it (``total_ips``), or None without steps."""
    durations = timed(durations, untimed)
    return batch_size / float(np.mean(durations)) if durations else None


class Report:
    def __init__(self, model, ngpus, cmd, metrics=None, info=None, untimed_iters=WARMUP_ITERATIONS):
        self.model = model
        self.ngpus = ngpus
        self.cmd = list(cmd)
        self.total_duration = 0.0
        self.metrics = OrderedDict(metrics or {})
        self.weights = None  # --mode val: what was scored
        self.per_class = None  # the latest validation's per-class results (per_class_results)
        self.info = OrderedDict(info or {})  # how the run was made, beyond cmd (INT8 calibration, --pretrained)
        self.untimed_iters = untimed_iters  # each epoch's first iterations, left out of its speed

    def add(self, key, value):
        self.metrics.setdefault(key, []).append(value)

    def add_epoch(self, mode, durations=(), batch_size=None, **values):
        """One epoch of ``mode`` ("train" or "val"): named values, then latency and speed from durations."""
        for name, value in values.items():
            self.add(f"{mode}.{name}", float(value))
        untimed = self.untimed_iters
        if untimed and len(durations) > untimed:
            self.add(f"{mode}.steady_after", steady.steady_since(list(durations)[:untimed]))
        durations = timed(durations, untimed)
        if not durations:
            return
        self.add(f"{mode}.timed_iters", len(durations))
        self.add(f"{mode}.latency_avg", float(np.mean(durations)))
        for p in LATENCY_PERCENTILES:
            self.add(f"{mode}.latency_{p}", float(np.percentile(durations, p)))
        if batch_size:
            self.add(f"{mode}.total_ips", batch_size / float(np.mean(durations)))

    def to_dict(self):
        out = OrderedDict(model=self.model, ngpus=self.ngpus, total_duration=self.total_duration,
                          cmd=self.cmd, metrics=self.metrics, untimed_iters=self.untimed_iters)
        if self.weights is not None:
            out["weights"] = self.weights
        if self.info:
            out["info"] = self.info
        if self.per_class is not None:
            out["per_class"] = self.per_class
        return out

    def save(self, path):
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path):
        with open(path) as f:
            raw = json.load(f, object_pairs_hook=OrderedDict)
        report = cls(raw["model"], raw["ngpus"], raw["cmd"], raw["metrics"],
                     untimed_iters=raw.get("untimed_iters", WARMUP_ITERATIONS))
        report.total_duration = raw["total_duration"]
        report.weights = raw.get("weights")
        report.info.update(raw.get("info", {}))
        report.per_class = raw.get("per_class")
        return report

    def add_per_class(self, confusion, epoch, names=None):
        """Keep a validation's per-class results (``confusion``: counts, rows true, columns predicted; None
        leaves the report as it is); ``names`` default to the report's info["class_names"]."""
        if confusion is not None:
            self.per_class = per_class_results(confusion, names or self.info.get("class_names"), epoch)

    def summary(self):
        """A few lines for people: epochs, the last and best validation top-1, speed, time."""
        metrics = self.metrics
        epochs = max((len(v) for v in metrics.values()), default=0)
        scoring = not any(key.startswith("train.") for key in metrics)  # --mode val: passes, not epochs
        unit = "scoring pass(es)" if scoring else "epoch(s)"
        lines = [f"{self.model} on {self.ngpus} worker(s): {epochs} {unit} in {self.total_duration:.0f} s"]
        top1 = metrics.get("val.top1")
        if top1 and scoring:
            lines.append(f"Validation top-1: {top1[-1]:.4f}")
        elif top1:  # epochs count from 1, as in the logs and in the checkpoint names (model-0003: epoch 3)
            best = int(np.argmax(top1))
            epochs_scored = metrics.get("val.epoch") or range(1, len(top1) + 1)  # --eval-every: not every epoch
            lines.append(f"Validation top-1: {top1[-1]:.4f} (best {top1[best]:.4f}, epoch "
                         f"{int(epochs_scored[best])})")
        target = self.info.get("target")
        if target:
            lines.append(f"Target top-1 {target['top1']:g} reached at epoch {target['epoch']} "
                         f"({target['reached_top1']:.4f}) after {target['train_seconds']:.0f} s of training, "
                         f"{target['wall_seconds']:.0f} s in all")
        if self.per_class:
            lines += per_class_summary(self.per_class)
        for mode in ("train", "val"):
            ips = metrics.get(f"{mode}.total_ips")
            if ips:
                last = "pass" if scoring else "epoch"
                timed = metrics.get(f"{mode}.timed_iters")
                # an epoch's first untimed_iters iterations are left out when it has more (docs/training.md)
                which = f"last {last}, {int(timed[-1])} timed iteration(s)" if timed else f"last {last}"
                lines.append(f"{mode.capitalize()} speed: {ips[-1]:.1f} images/s ({which})")
        return "\n".join(lines)


def per_class_results(confusion, names, epoch):
    """The report's "per_class" entry of a confusion matrix (rows: true class, columns: predicted; counts over
    every worker); ``names``: one per class, or None for the class indices."""
    confusion = np.asarray(confusion, dtype="int64")
    classes = confusion.shape[0]
    names = [str(n) for n in names] if names and len(names) == classes else [str(i) for i in range(classes)]
    samples = confusion.sum(axis=1)
    correct = np.diag(confusion)
    off = confusion.copy()
    np.fill_diagonal(off, 0)
    rows, cols = np.nonzero(off)
    order = np.lexsort((cols, rows, -off[rows, cols]))  # most frequent first, then by true and predicted class
    return OrderedDict(
        epoch=int(epoch), classes=names, samples=samples.tolist(), correct=correct.tolist(),
        top1=[float(c / n) if n else None for c, n in zip(correct, samples)],
        confusion=confusion.tolist() if classes <= DENSE_CONFUSION_MAX else None,
        confused_pairs=[[int(rows[i]), int(cols[i]), int(off[rows[i], cols[i]])] for i in order])


def confusion_from(per_class):
    """The whole confusion matrix of a report's "per_class" entry (rebuilt from its pairs for many classes)."""
    if per_class.get("confusion") is not None:
        return np.asarray(per_class["confusion"], dtype="int64")
    matrix = np.diag(np.asarray(per_class["correct"], dtype="int64"))
    for true, predicted, count in per_class["confused_pairs"]:
        matrix[true, predicted] = count
    return matrix


def per_class_summary(per_class, worst=5):
    """Lines for people: the classes with the lowest top-1 and the most frequent confusions."""
    names = per_class["classes"]
    scored = [(top1, i) for i, top1 in enumerate(per_class["top1"]) if top1 is not None]
    lines = [f"Per-class top-1 (epoch {per_class['epoch']}), lowest: " +
             ", ".join(f"{names[i]} {top1:.3f} ({per_class['correct'][i]}/{per_class['samples'][i]})"
                       for top1, i in sorted(scored)[:worst])]
    pairs = per_class["confused_pairs"][:worst]
    if pairs:
        lines.append("Most confused (true -> predicted): " +
                     ", ".join(f"{names[t]} -> {names[p]} x{n}" for t, p, n in pairs))
    return lines


def save_confusion_png(per_class, path):
    """Draw ``per_class`` (a report's entry) into the PNG ``path``: the confusion matrix, rows normalised to the
    true class's samples, for up to PNG_MATRIX_MAX classes; above that, a bar chart of the PNG_PAIRS most
    confused pairs (true -> predicted). Returns ``path``."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    names = per_class["classes"]
    classes = len(names)
    title = f"validation, epoch {per_class['epoch']}"
    if classes <= PNG_MATRIX_MAX:
        matrix = confusion_from(per_class)
        rates = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
        size = max(4.0, 0.35 * classes + 2.5)
        fig, ax = plt.subplots(figsize=(size + 1, size))
        image = ax.imshow(rates, cmap="Blues", vmin=0.0, vmax=1.0)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="share of the true class")
        ax.set_xticks(range(classes))
        ax.set_yticks(range(classes))
        ax.set_xticklabels(names, rotation=90 if classes > 10 else 0, fontsize=8)
        ax.set_yticklabels(names, fontsize=8)
        if classes <= 20:
            for t in range(classes):
                for p in range(classes):
                    if matrix[t, p]:
                        ax.text(p, t, str(matrix[t, p]), ha="center", va="center", fontsize=7,
                                color="white" if rates[t, p] > 0.5 else "black")
        ax.set_xlabel("predicted class")
        ax.set_ylabel("true class")
        ax.set_title(f"Confusion matrix ({title})")
    else:
        pairs = per_class["confused_pairs"][:PNG_PAIRS]
        fig, ax = plt.subplots(figsize=(8, max(3.0, 0.3 * len(pairs) + 1.5)))
        labels = [f"{names[t]} -> {names[p]}" for t, p, _ in pairs]
        ax.barh(range(len(pairs)), [n for _, _, n in pairs], color="tab:red")
        ax.set_yticks(range(len(pairs)))
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("validation images (true -> predicted)")
        ax.set_title(f"Most confused pairs of {classes} classes ({title})")
        if not pairs:
            ax.text(0.5, 0.5, "no confusions", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=100)
    plt.close(fig)
    os.replace(path + ".tmp.png", path)
    return path


def confusion_png_path(report_path):
    """Where a report's confusion PNG goes: beside it, <report name>-confusion.png."""
    return os.path.splitext(report_path)[0] + "-confusion.png"


def main():
    import argparse
    parser = argparse.ArgumentParser(prog="python -m rn50kit.reporting.report",
                                     description="Summarise a run's JSON report")
    parser.add_argument("report", help="report.json written by train.py")
    path = parser.parse_args().report
    try:
        with open(path) as f:
            raw = json.load(f)
        if isinstance(raw, dict) and "metric_keys" in raw and "bs" in raw:
            raise SystemExit(f"{parser.prog}: error: {path} is a benchmark.py result (a sweep), not a run's report: "
                             "benchmark.py printed its tables when it ran; this command summarises one run's report, "
                             "e.g. the sweep's per-run <out>-<n>,<bs>.json")
        report = Report.load(path)
    except (OSError, ValueError, KeyError) as problem:
        raise SystemExit(f"{parser.prog}: error: {path} is not a readable report ({problem})")
    print(report.summary())
    print(f"Report: {os.path.abspath(path)}")


if __name__ == "__main__":
    main()
