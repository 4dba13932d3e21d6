"""The sweep's Markdown tables: images/s per worker count and batch size (median and min-max of repeated runs),
weak scaling, the speed-up over a baseline, latencies, the warm-up each configuration needed, the failures."""
from rn50kit.benchmarking.results import LATENCIES, WARMUP_ITERS


def markdown_table(title, rows, columns, values, row_name, fmt):
    """Numbers are formatted with ``fmt``; strings are taken as they are; anything else is '-'."""
    lines = [f"### {title}", "", f"| {row_name} | " + " | ".join(str(c) for c in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for r in rows:
        cells = []
        for c in columns:
            value = values.get(str(r), {}).get(str(c))
            cells.append(fmt(value) if isinstance(value, (int, float)) else value if isinstance(value, str) else "-")
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def with_spread(cell, key, fmt, scale=1.0):
    """'median (min-max)' for a repeated configuration, the plain number otherwise, None when absent."""
    if key not in cell:
        return None
    text = fmt(cell[key] * scale)
    spread = cell.get("spread", {}).get(key)
    if spread:
        text += f" ({fmt(spread[0] * scale)}-{fmt(spread[1] * scale)})"
    return text


def model_title(result):
    """The network and its input, e.g. 'resnet50_v1.5, 3x224x224'."""
    shape = result.get("image_shape")
    return (result.get("model") or "model") + (f", {shape.replace(',', 'x')}" if shape else "")


def describe(result):
    """One line: what was measured, on what, with which weights."""
    data = f"real data ({result.get('data_backend')})" if result.get("real_data") else "synthetic data"
    parts = [result.get("dtype") or "default dtype", data]
    layout = result.get("layout")
    if layout:
        parts.append(f"{layout['input']} input")
    if result.get("weights"):
        parts.append("fresh weights" if result["weights"] == "fresh" else f"weights {result['weights']}")
    repeat = result.get("repeat", 1)
    parts.append(f"{result.get('timed_iters')} timed iterations per epoch")
    if repeat > 1:
        parts.append(f"median of {repeat} runs (min-max)")
    return ", ".join(parts)


def latency_tables(result, mode):
    """One table per worker count: batch sizes x latency statistics of ``mode``, in ms."""
    out = []
    for n in result["ngpus"]:
        row = result["metrics"].get(str(n), {})
        rows = {str(bs): {k: with_spread(row.get(str(bs), {}), f"{mode}.{k}", lambda v: f"{v:.2f}", 1000)
                          for k in LATENCIES} for bs in result["bs"]}
        if any(value for r in rows.values() for value in r.values()):
            out.append(markdown_table(f"{mode} latency per iteration (ms), {n} worker(s)", result["bs"], LATENCIES,
                                      rows, "batch size", lambda v: f"{v:.2f}"))
    return out


def tables(result):
    ngpus, bss, ips_key = result["ngpus"], result["bs"], result["metric_keys"][0]
    metrics = result["metrics"]
    dtype = result.get("dtype") or "default dtype"
    out = [f"{model_title(result)}: {describe(result)}\n"]
    modes = [key.split(".")[0] for key in result["metric_keys"] if key.endswith("total_ips")]
    for mode in modes:  # train_val: training first, then validation
        ips = {n: {bs: with_spread(cell, f"{mode}.total_ips", lambda v: f"{v:.1f}") for bs, cell in row.items()}
               for n, row in metrics.items()}
        out.append(markdown_table(f"{mode}.total_ips (images/s, {dtype}): workers x batch size per worker", ngpus,
                                  bss, ips, "workers", lambda v: f"{v:.1f}"))
    if len(ngpus) > 1 and result.get("weak_scaling"):
        out.append(markdown_table(f"Weak scaling of {ips_key}: ips(n) / ips(1)", ngpus, bss,
                                  result["weak_scaling"], "workers", lambda v: f"{v:.2f}"))
    if result.get("speedup"):
        against = result.get("speedup_against") or {}
        base = ", ".join(str(against[k]) for k in ("model", "image_shape", "dtype", "mode") if against.get(k))
        out.append(markdown_table(f"Speed-up of {dtype} over the baseline{f' ({base})' if base else ''} "
                                  f"({ips_key})", ngpus, bss, result["speedup"], "workers", lambda v: f"{v:.2f}"))
    for problem in result.get("speedup_warnings") or ():
        out.append(f"Warning about the baseline: {problem}\n")
    for mode in modes:
        out += latency_tables(result, mode)
    failed = [f"- n={f['ngpus']} bs={f['bs']}: {f['reason']}" for f in result["failed"]]
    for n, row in metrics.items():
        for bs, cell in row.items():
            failed += [f"- n={n} bs={bs}, one of {cell['runs'] + len(cell['failed_runs'])} runs: {reason}"
                       for reason in cell.get("failed_runs", [])]
    warmups = warmup_lines(result, modes)
    if warmups:
        out.append("### Warm-up: after how many of each epoch's untimed iterations the step time was steady (the "
                   "slowest run)\n\n" + "\n".join(warmups) + "\n")
    if failed:
        out.append("### Failed configurations\n\n" + "\n".join(failed) + "\n")
    return "\n".join(out)


def describe_steady(after, untimed=WARMUP_ITERS):
    """'steady after 7 of 20 untimed iterations' or 'NOT steady within the 160 untimed iterations: ...'."""
    if after is None:
        return f"NOT steady within the {untimed} untimed iterations: not a steady state's figure"
    return f"steady after {after:.0f} of {untimed} untimed iterations"


def warmup_lines(result, modes):
    """A line per configuration and mode whose runs' reports say when their step time was steady."""
    lines = []
    for n, row in result["metrics"].items():
        for bs, cell in row.items():
            untimed = cell.get("untimed_iters", result.get("warmup_iters", WARMUP_ITERS))
            lines += [f"- n={n} bs={bs} {mode}: {describe_steady(cell[f'{mode}.steady_after'], untimed)}"
                      for mode in modes if f"{mode}.steady_after" in cell]
    return lines
