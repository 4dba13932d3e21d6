"""The JSON report of a run, in the original kit's `--report` format.

{"model", "ngpus", "total_duration", "cmd", "metrics": {"train.loss": [one value per epoch], ...}}, and for
--mode val "weights" (the .params scored, or "fresh"). Accuracies are fractions; latencies are seconds per
iteration; total_ips is images/s over all workers; timed_iters is how many iterations those come from.
"""
import json
import os
from collections import OrderedDict

import numpy as np

LATENCY_PERCENTILES = [50, 90, 95, 99, 100]
WARMUP_ITERATIONS = 20  # the first iterations (graph building, caches) do not count towards speed


def write_json(path, value, indent=4):
    """Write ``value`` to ``path`` atomically (a temporary file renamed over it): a reader, or a run stopped in the
    middle, never sees half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=indent)
    os.replace(tmp, path)


class Report:
    def __init__(self, model, ngpus, cmd, metrics=None):
        self.model = model
        self.ngpus = ngpus
        self.cmd = list(cmd)
        self.total_duration = 0.0
        self.metrics = OrderedDict(metrics or {})
        self.weights = None  # --mode val: what was scored
        self.info = OrderedDict()  # how the run was made, beyond cmd (e.g. an INT8 graph's calibration)

    def add(self, key, value):
        self.metrics.setdefault(key, []).append(value)

    def add_epoch(self, mode, durations=(), batch_size=None, **values):
        """One epoch of ``mode`` ("train" or "val"): named values, then latency and speed from durations."""
        for name, value in values.items():
            self.add(f"{mode}.{name}", float(value))
        durations = list(durations)
        if len(durations) > WARMUP_ITERATIONS:
            durations = durations[WARMUP_ITERATIONS:]
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
                          cmd=self.cmd, metrics=self.metrics)
        if self.weights is not None:
            out["weights"] = self.weights
        if self.info:
            out["info"] = self.info
        return out

    def save(self, path):
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path):
        with open(path) as f:
            raw = json.load(f, object_pairs_hook=OrderedDict)
        report = cls(raw["model"], raw["ngpus"], raw["cmd"], raw["metrics"])
        report.total_duration = raw["total_duration"]
        report.weights = raw.get("weights")
        report.info.update(raw.get("info", {}))
        return report

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
            lines.append(f"Validation top-1: {top1[-1]:.4f} (best {top1[best]:.4f}, epoch {best + 1})")
        for mode in ("train", "val"):
            ips = metrics.get(f"{mode}.total_ips")
            if ips:
                last = "pass" if scoring else "epoch"
                timed = metrics.get(f"{mode}.timed_iters")
                which = (f"the last {last}'s {int(timed[-1])} timed iteration(s): its first {WARMUP_ITERATIONS} are "
                         "left out when it has more; the log's epoch line times them all") if timed else f"last {last}"
                lines.append(f"{mode.capitalize()} speed: {ips[-1]:.1f} images/s ({which})")
        return "\n".join(lines)


def main():
    import argparse
    parser = argparse.ArgumentParser(description="Summarise a run's JSON report")
    parser.add_argument("report", help="report.json written by train.py")
    path = parser.parse_args().report
    try:
        with open(path) as f:
            raw = json.load(f)
        if isinstance(raw, dict) and "metric_keys" in raw and "bs" in raw:
            raise SystemExit(f"report.py: error: {path} is a benchmark.py result (a sweep), not a run's report: "
                             "benchmark.py printed its tables when it ran; report.py summarises one run's report, "
                             "e.g. the sweep's per-run <out>-<n>,<bs>.json")
        report = Report.load(path)
    except (OSError, ValueError, KeyError) as problem:
        raise SystemExit(f"report.py: error: {path} is not a readable report ({problem})")
    print(report.summary())
    print(f"Report: {os.path.abspath(path)}")


if __name__ == "__main__":
    main()
