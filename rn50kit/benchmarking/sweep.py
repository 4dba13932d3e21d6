"""The sweep: every configuration's runner commands, the runs in interleaved rounds with progress and ETA, a run
not steady by the end of its untimed iterations run again with more, and each outcome into the result, written
to the JSON (-o) after every run."""
import os
import shlex
import sys
import time
from collections import OrderedDict
from pathlib import Path

from rn50kit.benchmarking import runs
from rn50kit.benchmarking.results import baseline_problems, combine_runs, read_run, speedup, weak_scaling, weights_used
from rn50kit.benchmarking.tables import describe_steady
from rn50kit.reporting.report import write_json


def save_json(result, path):
    """Atomically, after every configuration: an interrupted sweep keeps what it measured."""
    write_json(path, result)


def report_name(output, n, bs, run, repeat):
    """The original's per-run report names, <out>-<n>,<bs>.json; -runK added when runs repeat."""
    return output.parent / (f"{output.stem}-{n},{bs}" + (f"-run{run + 1}" if repeat > 1 else "") + ".json")


def command_builder(args, output, scratch, passthrough, flags):
    """build(n, bs, run, untimed=None) -> (runner's command, the report it writes) for one run."""
    def build(n, bs, run, untimed=None):
        report = report_name(output, n, bs, run, args.repeat)
        workspace = Path(scratch) / (f"run-{n},{bs}-{run}" + (f"-untimed{untimed}" if untimed is not None else ""))
        return runs.runner_command(args, n, bs, report, workspace, passthrough, flags, untimed), report
    return build


def runner_commands(args, configs, build):
    """{(n, bs, run): (runner's command, the report it writes)} for every configuration and repeat, with
    --untimed-iters warmup iterations."""
    return {(n, bs, run): build(n, bs, run) for n, bs in configs for run in range(args.repeat)}


def next_untimed(args, n, bs, untimed):
    """The untimed iterations to run a configuration with after a run not steady within ``untimed``: twice as
    many, at most --max-untimed-iters and what a given --num-examples holds; None when no more can be given."""
    most = args.max_untimed_iters
    if args.num_examples is not None and args.mode != "val":
        most = min(most, args.num_examples // (n * bs) - args.benchmark_iters)
    more = min(max(2 * untimed, untimed + 1), most)
    return more if more > untimed else None


def not_steady(report_path, keys, args):
    """Whether a run's report says its step time was not steady by the end of its untimed iterations."""
    try:
        cell = read_run(report_path, keys, args)[0]
    except (OSError, ValueError, KeyError):
        return False  # a bad report is recorded as such
    return any(cell[key] is None for key in cell if key.endswith("steady_after"))


def dry_run(args, configs, commands):
    """--dry-run: what the sweep would run, and what it would skip (runner's own checks, as the run); status 1
    when nothing would run."""
    runnable = 0
    for n, bs in configs:
        reason, _ = runs.check_upfront(commands[n, bs, 0][0])
        if reason:
            print(f"benchmark: would skip n={n} bs={bs}: {reason}", file=sys.stderr)
            continue
        runnable += 1
        for run in range(args.repeat):
            print(shlex.join(commands[n, bs, run][0]))
    return 0 if runnable else 1


class Sweep:
    """The runs of a sweep and their results as they come: each configuration's cells (a run that reported), its
    failures and the weights scored, written to the JSON (-o) after every run."""

    def __init__(self, args, keys, given_load, result, output, build, can_raise_untimed=True):
        self.args, self.keys, self.given_load, self.result, self.output = args, keys, given_load, result, output
        self.build, self.can_raise_untimed = build, can_raise_untimed  # whether the runs take --untimed-iters
        self.cells, self.failures, self.scored = {}, {}, []
        self.untimed = {}  # (n, bs): the untimed iterations its runs need, once one was not steady

    def record_failure(self, n, bs, reason):
        self.result["metrics"].setdefault(str(n), OrderedDict())[str(bs)] = {"failed": reason}
        self.result["failed"].append(OrderedDict(ngpus=n, bs=bs, reason=reason))

    def plan(self, configs, commands):
        """The configurations that can run here; the others (too many workers, float16 without a GPU, ...) are
        said and recorded up front: no minutes lost. Records each one's runner commands and launch plan."""
        runnable = []
        for n, bs in configs:
            reason, plan = runs.check_upfront(commands[n, bs, 0][0])
            if reason:
                print(f"benchmark: skipping n={n} bs={bs}: {reason}", file=sys.stderr)
                self.record_failure(n, bs, reason)
                continue
            runnable.append((n, bs))
            plan = runs.launch_plan(plan)
            self.result["runs"].setdefault(str(n), OrderedDict())[str(bs)] = OrderedDict(
                runner=[shlex.join(commands[n, bs, run][0]) for run in range(self.args.repeat)], **plan)
            if len(runnable) == 1:  # what runner resolved (machine defaults included) is the same for all
                settings = runs.run_settings(plan["command"])
                self.result.update((key, settings[key]) for key in
                                   ("dtype", "layout", "data_backend", "real_data", "data", "kv_store", "image_shape"))
        return runnable

    def run_all(self, runnable, commands):
        """Every run, in interleaved rounds, with progress and ETA; the exit status if interrupted, else None."""
        todo = [(n, bs, run) for run in range(self.args.repeat) for n, bs in runnable]
        start = time.time()
        for done, (n, bs, run) in enumerate(todo):
            elapsed = time.time() - start
            eta = f", ETA {elapsed / done * (len(todo) - done):.0f} s" if done else ""
            which = f" run {run + 1}/{self.args.repeat}" if self.args.repeat > 1 else ""
            print(f"benchmark: [{done + 1}/{len(todo)}] n={n} bs={bs}{which}{eta}", file=sys.stderr, flush=True)
            try:
                self.run_until_steady(n, bs, run, which, commands[n, bs, run])
            except KeyboardInterrupt as stop:
                finished = sum(len(c) for c in self.cells.values())
                kept = f"; the {finished} finished run(s) are in {self.output}" if finished else ""
                print(f"benchmark: interrupted during n={n} bs={bs}{which}{kept}", file=sys.stderr, flush=True)
                return getattr(stop, "status", 130)
        return None

    def run_until_steady(self, n, bs, run, which, planned):
        """One run of a configuration (``planned``: its command and report with --untimed-iters); again with
        more untimed iterations (next_untimed) while its report says the step time was not steady by their end,
        and for its later runs too. Records the run kept."""
        command, report_path = planned
        untimed = self.untimed.get((n, bs), self.args.untimed_iters)
        earlier = None  # (untimed, its report set aside, its command): the last run not steady
        while True:
            if untimed != self.args.untimed_iters:
                command, report_path = self.build(n, bs, run, untimed)
            try:
                reason = runs.run_one(command, self.timeout(untimed))
            except KeyboardInterrupt:  # the interrupted run's report (a partial epoch) is not a result
                report_path.unlink(missing_ok=True)
                raise
            if reason is not None and earlier is not None:  # a figure not steady beats none
                print(f"benchmark: n={n} bs={bs}{which}: the run with {untimed} untimed iterations failed ({reason}); "
                      f"keeping the one with {earlier[0]}", file=sys.stderr, flush=True)
                (untimed, aside, command), reason = earlier, None
                os.replace(aside, report_path)
                break
            more = next_untimed(self.args, n, bs, untimed) if self.can_raise_untimed and reason is None else None
            if more is None or not not_steady(report_path, self.keys, self.args):
                break
            print(f"benchmark: n={n} bs={bs}{which}: the step time was not steady within {untimed} untimed "
                  f"iterations; running it again with {more}", file=sys.stderr, flush=True)
            earlier = (untimed, report_path.with_name(f"{report_path.stem}.untimed-{untimed}.json"), command)
            os.replace(report_path, earlier[1])
            untimed = self.untimed[n, bs] = more
        if earlier is not None:
            Path(earlier[1]).unlink(missing_ok=True)
        self.result["runs"][str(n)][str(bs)]["runner"][run] = shlex.join(command)
        self.record_run(n, bs, run, which, reason, report_path)

    def timeout(self, untimed):
        """--timeout for a run with ``untimed`` iterations: stretched by its share of the first runs' iterations."""
        if self.args.timeout is None:
            return None
        first = self.args.untimed_iters + self.args.benchmark_iters
        return self.args.timeout * max(1.0, (untimed + self.args.benchmark_iters) / first)

    def read_report(self, n, bs, which, report_path):
        """The run's report into its configuration's cells; why it is bad, or None."""
        try:
            cell, weights, model = read_run(report_path, self.keys, self.args)
            self.result["model"] = self.result["model"] or model
            self.cells.setdefault((n, bs), []).append(cell)
            if weights:
                self.scored.append(weights)
            scored_note = f" ({'fresh weights' if weights == 'fresh' else weights})" if weights else ""
            mode = self.keys[0].split(".")[0]
            if f"{mode}.steady_after" in cell:
                scored_note += f"; {describe_steady(cell[f'{mode}.steady_after'], cell['untimed_iters'])}"
            print(f"benchmark: n={n} bs={bs}{which}: {self.keys[0]} {cell[self.keys[0]]:.1f} images/s{scored_note}",
                  file=sys.stderr, flush=True)
        except (OSError, ValueError, KeyError) as problem:
            return f"bad report: {problem}"
        return None

    def record_run(self, n, bs, run, which, reason, report_path):
        """One run's outcome (``reason`` it failed, or None) into the result, saved at once."""
        if reason is None:
            reason = self.read_report(n, bs, which, report_path)
        if reason is not None:
            print(f"benchmark: n={n} bs={bs}{which} failed: {reason}", file=sys.stderr, flush=True)
            self.failures.setdefault((n, bs), []).append(reason)
        result = self.result
        if (n, bs) in self.cells:
            combined = combine_runs(self.cells[n, bs])
            if self.failures.get((n, bs)):
                combined["failed_runs"] = self.failures[n, bs]
            result["metrics"].setdefault(str(n), OrderedDict())[str(bs)] = combined
        elif run + 1 == self.args.repeat:
            self.record_failure(n, bs, self.failures[n, bs][0])
        result["weights"] = weights_used(self.args.mode, self.given_load, self.scored)
        result["weak_scaling"] = weak_scaling(result["metrics"], self.keys[0])
        save_json(result, self.output)


def compare_with_baseline(result, baseline, ips_key, baseline_path):
    """--baseline: the speedup per configuration, what it is against, and warnings where the two differ."""
    result["speedup"] = speedup(result["metrics"], baseline, ips_key)
    result["speedup_against"] = OrderedDict((k, baseline.get(k)) for k in ("model", "image_shape", "dtype", "mode"))
    result["speedup_warnings"] = baseline_problems(result, baseline)
    for problem in result["speedup_warnings"]:
        print(f"benchmark: warning: --baseline {baseline_path}: {problem}", file=sys.stderr)
