"""A run's report into figures: images/s by the harmonic mean and latencies by the mean over the measured epochs,
repeated runs combined (median, min-max), weak scaling and the speed-up over a baseline, and which weights were
scored."""
import json
import os
import statistics
from collections import OrderedDict

# Untimed iterations at the start of every epoch (train.py --untimed-iters: graph building, caches), at first;
# doubled, up to --max-untimed-iters, while a run's step time was not steady by their end.
WARMUP_ITERS = 20
LATENCIES = ["latency_avg", "latency_50", "latency_90", "latency_95", "latency_99", "latency_100"]


def harmonic_mean(values):
    return len(values) / sum(1.0 / v for v in values)


def metric_keys(mode):
    modes = {"train_val": ["train", "val"], "train": ["train"], "val": ["val"]}[mode]
    return [f"{m}.{k}" for m in modes for k in ["total_ips"] + LATENCIES]


def summarize(report, keys, epochs, warmup, timed_iters=None):
    """One number per metric: harmonic mean of images/s, mean of latencies, over the epochs after warmup.
    With ``timed_iters``, every measured epoch must have timed exactly that many iterations."""
    metrics = report.get("metrics", {})
    cell = OrderedDict()
    for key in keys:
        values = metrics.get(key)
        if values is None:
            continue
        if len(values) != epochs:
            raise ValueError(f"{key} has {len(values)} epochs in the report, expected {epochs}")
        values = values[warmup:]
        if key.endswith("total_ips"):
            if min(values) <= 0:
                raise ValueError(f"{key} is not positive: {values}")
            cell[key] = harmonic_mean(values)
        else:
            cell[key] = sum(values) / len(values)
    ips_key = keys[0]
    if ips_key not in cell:
        raise ValueError(f"the report has no {ips_key}")
    for mode in sorted({key.split(".")[0] for key in cell}):
        counts = metrics.get(f"{mode}.timed_iters")
        if counts is None:
            continue  # a report from before timed_iters
        counts = counts[warmup:]
        if timed_iters is not None and any(count != timed_iters for count in counts):
            raise ValueError(f"{mode} timed {counts} iterations per epoch, expected {timed_iters}")
        cell[f"{mode}.timed_iters"] = min(counts)
    for mode in sorted({key.split(".")[0] for key in cell}):
        if f"{mode}.steady_after" in metrics:  # the latest of the measured epochs; None: one never was
            after = metrics[f"{mode}.steady_after"][warmup:]
            cell[f"{mode}.steady_after"] = None if None in after else max(after)
    return cell


def read_run(report_path, keys, args):
    """(the run's summary cell, the weights it scored) from its report; ValueError/OSError/KeyError if bad."""
    with open(report_path) as f:
        report = json.load(f)
    cell = summarize(report, keys, args.epochs, args.warmup, args.benchmark_iters)
    cell["untimed_iters"] = report.get("untimed_iters", WARMUP_ITERS)  # a train.py without --untimed-iters: 20
    return cell, report.get("weights"), report.get("model", "")


def combine_runs(cells):
    """Repeated runs of one configuration: the median of each metric; with more than one run also its
    [min, max] spread and every run's value."""
    combined = OrderedDict()
    keys = [key for key in cells[0] if isinstance(cells[0][key], (int, float)) and
            not key.endswith(("steady_after", "untimed_iters"))]
    for key in (key for key in cells[0] if key.endswith("steady_after")):  # the slowest run to settle
        after = [cell.get(key) for cell in cells]
        combined[key] = None if None in after else max(after)
    if "untimed_iters" in cells[0]:
        combined["untimed_iters"] = max(cell["untimed_iters"] for cell in cells)
    for key in keys:
        values = [cell[key] for cell in cells]
        combined[key] = min(values) if key.endswith("timed_iters") else statistics.median(values)
    combined["runs"] = len(cells)
    if len(cells) > 1:
        combined["spread"] = OrderedDict((key, [min(c[key] for c in cells), max(c[key] for c in cells)])
                                         for key in keys if not key.endswith("timed_iters"))
        combined["repeats"] = OrderedDict((key, [c[key] for c in cells])
                                          for key in keys if not key.endswith("timed_iters"))
    return combined


def weak_scaling(metrics, ips_key):
    """ips(n) / ips(1) per batch size, where the single-worker run exists."""
    scaling = OrderedDict()
    for n, row in metrics.items():
        for bs, cell in row.items():
            base = metrics.get("1", {}).get(bs, {}).get(ips_key)
            if base and ips_key in cell:
                scaling.setdefault(n, OrderedDict())[bs] = cell[ips_key] / base
    return scaling


def speedup(metrics, baseline, ips_key):
    """ips / baseline ips per cell present in both (e.g. bfloat16 or float16 against float32)."""
    result = OrderedDict()
    for n, row in metrics.items():
        for bs, cell in row.items():
            base = baseline.get("metrics", {}).get(n, {}).get(bs, {}).get(ips_key)
            if base and ips_key in cell:
                result.setdefault(n, OrderedDict())[bs] = cell[ips_key] / base
    return result


def baseline_problems(result, baseline):
    """Why a speed-up against ``baseline`` may compare other things than precision: another network, image shape
    or mode (another dtype is the usual purpose, and named in the table's title), or no configuration in common."""
    problems = []
    for key, what in (("model", "network"), ("image_shape", "image shape"), ("mode", "mode")):
        ours, theirs = result.get(key), baseline.get(key)
        if ours and theirs and str(ours) != str(theirs):
            problems.append(f"the baseline's {what} is {theirs}, this sweep's {ours}")
    common = [(n, bs) for n, row in result["metrics"].items() for bs in row
              if bs in baseline.get("metrics", {}).get(n, {})]
    if not common:
        problems.append("the baseline has none of this sweep's worker counts and batch sizes: no speed-up to show")
    return problems


def weights_used(mode, given_load, scored):
    """'fresh' or the .params path; training runs start from fresh weights (--resume none)."""
    if mode != "val":
        return "fresh"
    if scored:
        return scored[0] if len(set(scored)) == 1 else "mixed: " + ", ".join(sorted(set(scored)))
    return os.path.abspath(given_load) if given_load else "fresh"
