"""The JSON report of a run, in the original kit's `--report` format.

{"model", "ngpus", "total_duration", "cmd", "metrics": {"train.loss": [one value per epoch], ...}}
Accuracies are fractions; latencies are seconds per iteration; total_ips is images/s over all workers.
"""
import json
import os
from collections import OrderedDict

import numpy as np

LATENCY_PERCENTILES = [50, 90, 95, 99, 100]
WARMUP_ITERATIONS = 20  # the first iterations (graph building, caches) do not count towards speed


class Report:
    def __init__(self, model, ngpus, cmd, metrics=None):
        self.model = model
        self.ngpus = ngpus
        self.cmd = list(cmd)
        self.total_duration = 0.0
        self.metrics = OrderedDict(metrics or {})

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
        self.add(f"{mode}.latency_avg", float(np.mean(durations)))
        for p in LATENCY_PERCENTILES:
            self.add(f"{mode}.latency_{p}", float(np.percentile(durations, p)))
        if batch_size:
            self.add(f"{mode}.total_ips", batch_size / float(np.mean(durations)))

    def to_dict(self):
        return OrderedDict(model=self.model, ngpus=self.ngpus, total_duration=self.total_duration,
                           cmd=self.cmd, metrics=self.metrics)

    def save(self, path):
        """Write atomically, so a reader never sees half a report."""
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_dict(), f, indent=4)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path):
        with open(path) as f:
            raw = json.load(f, object_pairs_hook=OrderedDict)
        report = cls(raw["model"], raw["ngpus"], raw["cmd"], raw["metrics"])
        report.total_duration = raw["total_duration"]
        return report
