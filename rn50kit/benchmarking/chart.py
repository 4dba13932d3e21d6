"""The sweep's chart: images/s per batch size, a line per worker count, written beside the JSON."""
import os
import sys
from pathlib import Path

from rn50kit.benchmarking.tables import describe, model_title


def plot(result, path):
    """images/s per batch size, one line per worker count (error bars: min-max of repeated runs); None, with
    the reason on stderr, when there is nothing to draw or no matplotlib."""
    ips_key = result["metric_keys"][0]
    lines = []
    for n in result["ngpus"]:
        row = result["metrics"].get(str(n), {})
        points = [(bs, row[str(bs)]) for bs in result["bs"] if ips_key in row.get(str(bs), {})]
        if points:
            lines.append((n, points))
    if not lines:
        print("benchmark: no chart: no configuration succeeded", file=sys.stderr)
        if Path(path).exists():  # an older sweep's chart beside this JSON would contradict it
            os.remove(path)
        return None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("benchmark: note: matplotlib is not installed, no chart", file=sys.stderr)
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n, points in lines:
        xs = [bs for bs, _ in points]
        ys = [cell[ips_key] for _, cell in points]
        spreads = [cell.get("spread", {}).get(ips_key, [cell[ips_key]] * 2) for _, cell in points]
        errors = [[y - lo for y, (lo, _) in zip(ys, spreads)], [hi - y for y, (_, hi) in zip(ys, spreads)]]
        ax.errorbar(xs, ys, yerr=errors if result.get("repeat", 1) > 1 else None, marker="o", capsize=3,
                    label=f"{n} worker(s)")
    ax.set_xlabel("batch size per worker")
    ax.set_ylabel("images/s")
    ax.set_title(f"{model_title(result)} {ips_key}\n{describe(result)}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = f"{path}.tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
    return path
