"""When a timed step is warm: its step time steady, by one rule the benchmark tools share (bench_models' workers,
the runs benchmark.py reads). No MXNet, no NumPy: the PyTorch worker imports it in its own venv.

The rule: after ``n`` warm-up steps the step time is steady when the median of the last ``window`` step times is
within ``tolerance`` (relative) of the median of the ``window`` before them. A fixed count is not enough: PyTorch's
float32 training step still sped up by a quarter between its first and fourth step (issue 44), MXNet's first
steps build the graph and fill oneDNN's caches.
"""
import statistics
import time

WINDOW = 3  # step times per median
TOLERANCE = 0.05  # relative difference of the two medians
MAX_WARMUP = 30  # steps, after which a variant is timed anyway and said never to have settled


def steady(step_times, window=WINDOW, tolerance=TOLERANCE):
    """Whether the last ``2 * window`` of ``step_times`` (seconds, in order) say the step time is steady."""
    if len(step_times) < 2 * window:
        return False
    last = statistics.median(step_times[-window:])
    before = statistics.median(step_times[-2 * window:-window])
    return abs(last - before) <= tolerance * before


def settled_after(step_times, window=WINDOW, tolerance=TOLERANCE, minimum=0):
    """How many of ``step_times`` it took until the step time was steady (at least ``minimum``), or None if it
    never was."""
    for n in range(max(minimum, 2 * window), len(step_times) + 1):
        if steady(step_times[:n], window, tolerance):
            return n
    return None


def steady_since(step_times, window=WINDOW, tolerance=TOLERANCE):
    """For step times already run (an epoch's untimed iterations): the fewest of them after which the step time
    was steady at every step to the last, or None if it is not steady at the last. Unlike settled_after, a plateau
    the step time later left (a slow first stretch, then faster) does not count."""
    since = None
    for n in range(2 * window, len(step_times) + 1):
        if not steady(step_times[:n], window, tolerance):
            since = None
        elif since is None:
            since = n
    return since


def warm_up(step, minimum=0, maximum=MAX_WARMUP, window=WINDOW, tolerance=TOLERANCE, clock=time.perf_counter):
    """Run ``step()`` until its time is steady, at least ``minimum`` and at most ``maximum`` times: {"steps": how
    many ran, "settled": whether steady by then, "step_seconds": each one's time, and the rule's "window" and
    "tolerance"}."""
    times, settled = [], False
    while not settled and len(times) < max(minimum, maximum):
        start = clock()
        step()
        times.append(clock() - start)
        settled = len(times) >= minimum and steady(times, window, tolerance)
    return {"steps": len(times), "settled": settled, "step_seconds": times, "window": window,
            "tolerance": tolerance}


def describe(warmup):
    """'steady after 7 warm-up steps' or 'NOT steady after 30 warm-up steps (...)', for a warm_up() result."""
    if warmup["settled"]:
        return f"steady after {warmup['steps']} warm-up steps"
    return (f"NOT steady after {warmup['steps']} warm-up steps (the median of the last {warmup['window']} step times "
            f"moved by more than {100 * warmup['tolerance']:g} %): its figure is not a steady state's")
