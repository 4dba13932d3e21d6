"""Benchmark (not a test): three parts of a training step on this CPU, each the kit's way against another.

    python tools/bench_step_parts.py [--parts optimizer,ema,stats] [--num-layers 50] [--rounds 3] [--iters 3]
                                     [--json FILE]

optimizer: the update alone (Gluon Trainer.step over gradients already in place) of ResNet-N v1.5 float32,
MXNet's own mx.optimizer.SGD/LARS/LAMB against rn50kit.training.optimizers' (BLAS norms, a weight at a time),
both with the parameters a run gives them (optimizers.optimizer_params, the weight-decay groups of set_wd_groups)
and the Gluon Trainer make_trainer builds on one device.
ema: EMA.update (rn50kit/training/ema.py: one multi_sgd_update per 60 arrays, multi_mp_sgd_update for float16)
against the per-array way it replaced (PerArrayEMA, re-created here: a cast and 4 operators per array), on 267
tiny arrays in float32 and float16 (as many as ResNet-50 has; their cost is dispatch) and on the network's own
float32 parameters (there the memory traffic counts).
stats: StatsGuard.keep (rn50kit/training/precision.py) its two ways, on the network's statistics: one copy per
BatchNorm statistic (its way on a CPU, as "ours") against one amp_multicast per device (its way on a GPU, where each
copy would be a kernel launch; on a CPU the multicast measured slower).

Both ways of an item must compute the same thing, or the comparison says nothing: before timing, each item is
called once each way on the same inputs and the results compared (`check:` lines; a failed check makes the exit
status 1). Updates are compared by their largest difference as a share of the largest change the call made (an
update is small beside its weight, so a tolerance on the weights would pass anything); copies must be exact. LAMB
is the one intended difference: for the parameters without weight decay ours takes timm's plain Adam step where
MXNet's scales it by the trust ratio (optimizers.LAMB), so those are checked against that step computed here.

The items run in interleaved rounds (each way of each item in turn, again and again), so load from other processes
hits them alike. Every way is called --warmup times before the first round; each round times --iters calls (more
for a quick call, to fill --min-ms) between two mx.nd.waitall() (MXNet is asynchronous) and keeps their mean.
Printed per item: the median over the rounds and [min-max] in ms a call, and the ratio reference / ours (above 1:
ours is faster); --json FILE writes the same. One OpenMP thread per physical core, as runner gives a single worker
(an OMP_NUM_THREADS already set wins). The heading gives the load average before and after: on a busy machine
each OpenMP parallel region waits for its threads' turn, and the fused operators open many (amp_multicast runs a
oneDNN reorder per array; multi_sgd_update one region over its longest array, every thread looping over all
arrays), where a small copy runs on one thread: there the figures move with the load (compare the ratios of one
run, and runs with OMP_NUM_THREADS=1).
"""
import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from rn50kit.hardware import devices  # noqa: E402  (MXNet-free)

if __name__ == "__main__":  # before MXNet loads (MXNet alone takes half the logical CPUs on x86)
    os.environ.setdefault("OMP_NUM_THREADS", str(devices.openmp_threads()))
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import gluon  # noqa: E402

import models  # noqa: E402
from rn50kit.training import optimizers  # noqa: E402
from rn50kit.training.ema import EMA, first_copy  # noqa: E402
from rn50kit.training.precision import StatsGuard  # noqa: E402

PARTS = ("optimizer", "ema", "stats")
WAYS = ("reference", "ours")
OPTIMIZERS = {"sgd": mx.optimizer.SGD, "lars": mx.optimizer.LARS, "lamb": mx.optimizer.LAMB}  # MXNet's own
LEARNING_RATE, WEIGHT_DECAY, MOMENTUM = 0.1, 5e-5, 0.9  # a ResNet-50 run's (the values do not change the cost)
EMA_DECAY = 0.999
TINY_ARRAYS = 267  # ResNet-50's parameters and statistics
TINY_SIZE = 16  # elements: small enough that an update costs its dispatch only
TOLERANCE = 1e-3  # of the largest change a call made: float32 sums in another order differ by far less
SEED = 1


@dataclasses.dataclass
class Item:
    """One thing timed two ways: ``calls`` {way: the call}, ``check`` {"passed", "detail"}; ``ms`` {way: the ms a
    call of each round}, ``calls_timed`` {way: calls a round}."""
    part: str
    name: str
    reference_name: str
    calls: dict
    check: dict
    ms: dict = dataclasses.field(default_factory=lambda: {way: [] for way in WAYS})
    calls_timed: dict = dataclasses.field(default_factory=dict)


# --- the checks ------------------------------------------------------------------------------------------------

def largest_share(results, expected, before):
    """The largest |result - expected| over the arrays, as a share of the largest |expected - before| (the change
    the call made); all three {name: numpy array}, over ``expected``'s names."""
    change = max(float(np.abs(expected[n] - before[n]).max()) for n in expected)
    if change == 0:
        return float("inf")  # the call changed nothing: no comparison is possible
    return max(float(np.abs(results[n] - expected[n]).max()) for n in expected) / change


def agreement(share, what):
    """The check's record for a share from largest_share."""
    return {"passed": share <= TOLERANCE, "largest_difference": share,
            "detail": f"{what}: largest difference {share:.1e} of the largest change (tolerance {TOLERANCE:g})"}


def numpy_values(arrays):
    return {name: a.asnumpy() for name, a in arrays.items()}


# --- optimizer: MXNet's classes against ours -------------------------------------------------------------------

def model_network(num_layers):
    """ResNet-N v1.5 float32 as a run builds it (Xavier weights, weight-decay groups), with gradients in place."""
    mx.random.seed(SEED)
    net = models.get_model(f"resnet{num_layers}_v1.5")
    net.initialize(mx.init.Xavier())  # every shape is known: no forward pass needed
    optimizers.set_wd_groups(net)
    for p in trainable(net):
        p.grad()[:] = mx.nd.random.normal(0, 0.01, p.shape)
    return net


def trainable(net):
    return [p for p in net.collect_params().values() if p.grad_req != "null"]


def trainer_pair(net, name):
    """(MXNet's, ours): Gluon Trainers on ``net``'s parameters as make_trainer builds them on one device (no kvstore),
    their optimizers given the same parameters, a run's."""
    settings = dict(optimizers.optimizer_params(net, name, WEIGHT_DECAY, MOMENTUM), learning_rate=LEARNING_RATE)
    return tuple(gluon.Trainer(net.collect_params(), optimizer, kvstore=None, update_on_kvstore=False)
                 for optimizer in (OPTIMIZERS[name](**settings), optimizers.create(name, **settings)))


def update_step(trainer, params):
    """One update over the gradients in place. The Trainer refuses a gradient no backward pass wrote since its last
    step: each is marked fresh first, as backward marks it (the same few microseconds for both ways)."""
    def step():
        for p in params:
            for array in p.list_data():
                array._fresh_grad = True
        trainer.step(1)
    return step


def lamb_plain_steps(params, before, epsilon):
    """timm's LAMB after its first step for parameters without weight decay: the bias-corrected Adam step alone,
    lr m_hat / (sqrt(v_hat) + eps), where m_hat = g and v_hat = g^2 after one step."""
    steps = {}
    for p in params:
        grad = p.grad().asnumpy()
        steps[p.name] = before[p.name] - LEARNING_RATE * grad / (np.abs(grad) + epsilon)
    return steps


def check_optimizer(name, net, trainers, steps):
    """One update each way from the same weights (put back after); ours compared with MXNet's, and for LAMB's
    parameters without weight decay with timm's step instead (the intended difference, optimizers.LAMB)."""
    params = trainable(net)
    start = {p.name: p.data().copy() for p in params}
    after = []
    for step in steps:
        for p in params:
            p.set_data(start[p.name])
        step()
        after.append(numpy_values({p.name: p.data() for p in params}))
    for p in params:
        p.set_data(start[p.name])
    before = numpy_values(start)
    mxnets, ours = after
    plain = [p for p in params if name == "lamb" and p.wd_mult == 0]
    adapted = [p.name for p in params if p not in plain]
    check = agreement(largest_share(ours, {n: mxnets[n] for n in adapted}, before),
                      f"ours vs MXNet's after one update, {len(adapted)} arrays")
    if plain:
        timm = lamb_plain_steps(plain, before, trainers[1]._optimizer.epsilon)
        timms = agreement(largest_share(ours, timm, before),
                          f"the other {len(plain)} (no weight decay) vs timm's plain Adam step computed here")
        check = {"passed": check["passed"] and timms["passed"], "detail": f"{check['detail']}; {timms['detail']}",
                 "largest_difference": max(check["largest_difference"], timms["largest_difference"])}
    return check


def optimizer_items(net):
    items = []
    for name in OPTIMIZERS:
        trainers = trainer_pair(net, name)
        steps = [update_step(trainer, trainable(net)) for trainer in trainers]
        check = check_optimizer(name, net, trainers, steps)
        items.append(Item("optimizer", f"{name.upper()} update", f"mx.optimizer.{OPTIMIZERS[name].__name__}",
                          dict(zip(WAYS, steps)), check))
    return items


# --- ema: the fused update against the per-array one ----------------------------------------------------------

class PerArrayEMA(EMA):
    """EMA.update as ema.py had it before its fused kernels (commit 7979c6a's parent), re-created for comparison:
    per array a cast to float32 (a copy for float32 weights), two products, a sum and the assignment back."""

    def update(self):
        for name, p in self.params.items():
            value = first_copy(p).astype("float32").as_in_context(self.shadow[name].context)
            self.shadow[name][:] = self.decay * self.shadow[name] + (1 - self.decay) * value


class TinyArrays(gluon.Block):
    """TINY_ARRAYS parameters of TINY_SIZE elements in ``dtype``."""

    def __init__(self, dtype):
        super().__init__(prefix=f"tiny_{dtype}_")
        for i in range(TINY_ARRAYS):
            self.params.get(f"array{i}", shape=(TINY_SIZE,), dtype=dtype, init=mx.init.Uniform(1.0))


def check_ema(averages):
    """Both averages set to the same values away from the weights (they start equal to them, and an update would
    change nothing), then updated once: ours compared with the per-array way."""
    reference, ours = averages
    before = {name: mx.nd.random.normal(0, 1, a.shape) for name, a in reference.shadow.items()}
    for average in averages:
        for name, a in average.shadow.items():
            a[:] = before[name]
        average.update()
    return agreement(largest_share(numpy_values(ours.shadow), numpy_values(reference.shadow), numpy_values(before)),
                     f"ours vs the per-array way after one update, {len(before)} arrays")


def ema_items(net):
    tiny = {}
    for dtype in ("float32", "float16"):
        tiny[dtype] = TinyArrays(dtype)
        tiny[dtype].initialize()
    networks = [(f"{TINY_ARRAYS} tiny {dtype} arrays", block) for dtype, block in tiny.items()]
    networks.append((f"{len(net.collect_params().keys())} arrays of the model, float32", net))
    items = []
    for title, network in networks:
        averages = PerArrayEMA(network, EMA_DECAY), EMA(network, EMA_DECAY)
        items.append(Item("ema", f"update, {title}", "per-array (5 operators an array)",
                          dict(zip(WAYS, (average.update for average in averages))), check_ema(averages)))
    return items


# --- stats: one amp_multicast against one copy per statistic --------------------------------------------------

def stats_items(net):
    """The network's statistics set to new values (a guard's backup starts equal to them), kept each way (one
    copy per array, what StatsGuard does on a CPU; one amp_multicast, what it does on a GPU): both backups must
    equal the statistics exactly."""
    guards = StatsGuard(net, fused=True), StatsGuard(net, fused=False)  # the reference, ours on a CPU
    for array in guards[1].stats:
        array[:] = mx.nd.random.uniform(0, 1, array.shape)
    for guard in guards:
        guard.keep()
    stats = [a.asnumpy() for a in guards[1].stats]
    exact = all(np.array_equal(s, b.asnumpy()) for guard in guards for s, b in zip(stats, guard.backup))
    check = {"passed": exact, "largest_difference": 0.0 if exact else float("inf"),
             "detail": f"both backups equal the {len(stats)} statistics exactly" if exact
             else "a backup differs from the statistics"}
    return [Item("stats", f"keep, {len(stats)} statistics, a copy each", "one amp_multicast (GPU way)",
                 dict(zip(WAYS, (guard.keep for guard in guards))), check)]


# --- timing ----------------------------------------------------------------------------------------------------

def time_calls(call, iters):
    """The mean ms of ``iters`` calls, MXNet's queue empty before and after."""
    mx.nd.waitall()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    mx.nd.waitall()
    return 1000 * (time.perf_counter() - start) / iters


def calls_per_round(warmup_ms, iters, min_ms):
    """--iters, or more for a quick call: enough that a round's timing spans --min-ms (a timing of a few tenths of
    a millisecond is mostly the timer's and the scheduler's noise)."""
    return max(iters, math.ceil(min_ms / max(warmup_ms, 1e-3)))


def run_rounds(items, args):
    """Every way warmed up (which says how many calls fill --min-ms), then timed once per round, interleaved. The
    order of the two ways flips each round: whichever runs second finds the other's arrays gone from the cache."""
    counts = {}
    for item in items:
        for way in WAYS:
            warmup_ms = time_calls(item.calls[way], args.warmup)
            counts[item.name, way] = calls_per_round(warmup_ms, args.iters, args.min_ms)
    for round_ in range(args.rounds):
        for item in items:
            for way in WAYS if round_ % 2 == 0 else WAYS[::-1]:
                item.ms[way].append(time_calls(item.calls[way], counts[item.name, way]))
                item.calls_timed[way] = counts[item.name, way]
        print(f"bench_step_parts: round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "rounds": values}


def results_of(items):
    """{part: {item: both ways' summaries, the ratio reference / ours of the medians, the check}}."""
    parts = {}
    for item in items:
        ways = {way: dict(summary(item.ms[way]), name=item.reference_name if way == "reference" else "ours",
                          calls_a_round=item.calls_timed[way]) for way in WAYS}
        parts.setdefault(item.part, {})[item.name] = dict(
            ways, ratio=ways["reference"]["median"] / ways["ours"]["median"], check=item.check)
    return parts


def print_results(heading, parts):
    """The heading, a line per item (both ways: median [min-max] ms, then the ratio), and the checks."""
    print(heading)
    rows = [(part, name, r) for part, results in parts.items() for name, r in results.items()]
    width = max(len(r["reference"]["name"]) for _, _, r in rows)
    for part, name, r in rows:
        ways = [f"{r[way]['name']:<{width if way == 'reference' else 4}} {r[way]['median']:>8.2f} "
                f"{'[%.2f-%.2f]' % (r[way]['min'], r[way]['max']):<19}" for way in WAYS]
        print(f"{part:<9} {name:<40} {'  '.join(ways)} {r['ratio']:6.2f}x")
    for part, name, r in rows:
        print(f"check: {part} {name}: {'ok' if r['check']['passed'] else 'FAILED'}: {r['check']['detail']}")


# --- command line ----------------------------------------------------------------------------------------------

def parts_list(text):
    parts = [p.strip() for p in text.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        raise argparse.ArgumentTypeError(f"unknown part {', '.join(unknown) or '(none)'}; choose from "
                                         f"{','.join(PARTS)}")
    return [p for p in PARTS if p in parts]


def get_args_parser():
    from rn50kit.common.helptext import HelpFormatter
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument("--parts", type=parts_list, default=list(PARTS),
                        help=f"what to time, comma-separated (default: {','.join(PARTS)})")
    parser.add_argument("--num-layers", type=int, default=50, choices=sorted(models.RESNET_SPEC),
                        help="the ResNet v1.5 whose parameters the optimizer, EMA and statistics parts use")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (the median is kept)")
    parser.add_argument("--iters", type=int, default=3, help="timed calls of each way per round")
    parser.add_argument("--warmup", type=int, default=1,
                        help="calls of each way before the first round (their time sets how many fill --min-ms)")
    parser.add_argument("--min-ms", type=float, default=100,
                        help="a quick call is timed this long a round at least (more calls than --iters)")
    parser.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    return parser


def build_items(parts, net):
    builders = {"optimizer": optimizer_items, "ema": ema_items, "stats": stats_items}
    return [item for part in parts for item in builders[part](net)]


def write_json(path, numbers):
    """--json, written atomically."""
    with open(path + ".tmp", "w") as f:
        json.dump(numbers, f, indent=2)
    os.replace(path + ".tmp", path)


def main(argv=None):
    parser = get_args_parser()
    args = parser.parse_args(argv)
    if min(args.rounds, args.iters, args.warmup) < 1 or args.min_ms < 0:
        parser.error("--rounds, --iters and --warmup must be positive, --min-ms not negative")
    # The 1-minute load average before and after (this process counts 1): on a busy machine every OpenMP parallel
    # region waits for its threads' turn, which can turn a fused kernel's advantage around.
    load = [os.getloadavg()[0]]
    net = model_network(args.num_layers)
    items = build_items(args.parts, net)
    run_rounds(items, args)
    load.append(os.getloadavg()[0])
    parts = results_of(items)
    model, weights = f"resnet{args.num_layers}_v1.5", sum(p.data().size for p in trainable(net))
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print_results(f"# {model} float32 ({weights / 1e6:.1f} M weights), {args.rounds} interleaved rounds of "
                  f"{args.iters} timed calls (at least {args.min_ms:g} ms) after {args.warmup} warm-up, "
                  f"OMP_NUM_THREADS {threads}, {os.cpu_count()} CPUs, load average {load[0]:.1f} -> {load[1]:.1f}; "
                  "ms a call, median [min-max], and reference / ours", parts)
    passed = all(r["check"]["passed"] for results in parts.values() for r in results.values())
    if args.json:
        write_json(args.json, dict(model=model, weights=weights, rounds=args.rounds, iters=args.iters,
                                   warmup=args.warmup, min_ms=args.min_ms, omp_num_threads=threads,
                                   load_average=load, cmd=sys.argv, parts=parts, checks_passed=passed))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
