"""horovodrun's elastic runs (docs/multi-node.md, Elastic runs): their flags, their checks, the discovery script
runner gives the driver, the variables they must leave out, and the driver's log turned into runner's lines."""
import logging
import os
import shlex
import sys

from rn50kit.config.cli import UsageError
from rn50kit.launch import discovery

ELASTIC_FLAGS = ("min_np", "max_np", "host_discovery_script", "slots_per_host", "elastic_timeout", "reset_limit",
                 "blacklist_cooldown_range")
# Variables that fix a value of Horovod's parameter manager. Horovod 0.28.1 cannot re-initialise after an elastic
# reset with any of them set: a fixed value is taken out of its Bayesian parameter's vectors, and the next init
# writes its default to the removed index (horovod/common/parameter_manager.cc:449, BayesianParameter::SetValue):
# a segmentation fault in the background thread of every surviving worker (seen here with the two runner sets).
ELASTIC_UNSAFE_ENV = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_AUTOTUNE")


def add_elastic_args(parser):
    """horovodrun's elastic flags, under their own names."""
    group = parser.add_argument_group(
        "Elastic runs", "workers that come and go without stopping the run (horovodrun's elastic driver, Gloo): "
        "give --min-np (and -H/--hostfile, whose hosts runner's own discovery script reports; a --hostfile is read "
        "again every few seconds, so adding a line adds a host) or --host-discovery-script")
    group.add_argument("--min-np", type=int, metavar="N", help="the fewest workers the run goes on with")
    group.add_argument("--max-np", type=int, metavar="N", help="the most workers the run grows to")
    group.add_argument("--host-discovery-script", metavar="SCRIPT",
                       help="prints the available hosts, one `host:slots` per line (horovodrun runs it every few "
                            "seconds)")
    group.add_argument("--slots-per-host", type=int, metavar="N",
                       help="slots of a host the discovery script prints without them")
    group.add_argument("--elastic-timeout", type=int, metavar="SECONDS",
                       help="how long the run waits for --min-np workers before it ends (horovodrun's default: 600)")
    group.add_argument("--reset-limit", type=int, metavar="N", help="end the run after this many world changes")
    group.add_argument("--blacklist-cooldown-range", type=int, nargs=2, metavar=("MIN", "MAX"),
                       help="seconds before a failed host may come back (default: never)")


def is_elastic(args):
    return args.min_np is not None or args.max_np is not None or args.host_discovery_script is not None


def check_elastic(args, launcher):
    """An elastic run's flags against the rest (``launcher``: the launchers.Launcher chosen), before anything
    starts."""
    given = [f"--{name.replace('_', '-')}" for name in ELASTIC_FLAGS if getattr(args, name) is not None]
    if not is_elastic(args):
        if given:
            raise UsageError(f"{given[0]} is for elastic runs: give --min-np (or --max-np or "
                             "--host-discovery-script) too")
        return
    if not launcher.elastic or args.kv_store != "horovod":
        raise UsageError(f"elastic runs need horovodrun's elastic driver, which runs on Gloo: use --launcher horovod "
                         f"--kv-store horovod (not --launcher {args.launcher} --kv-store {args.kv_store})")
    min_np, max_np = args.min_np or args.ngpus, args.max_np or args.ngpus
    if not 1 <= min_np <= args.ngpus <= max_np:
        raise UsageError(f"elastic runs need 1 <= --min-np <= -n <= --max-np; got {min_np}, {args.ngpus}, {max_np}")
    if args.host_discovery_script and (args.hosts or args.hostfile):
        raise UsageError("give either --host-discovery-script or -H/--hostfile (runner writes the discovery "
                         "script for those)")


def elastic_flags(args):
    """horovodrun's flags for an elastic run: its own, and a discovery script reporting -H or --hostfile."""
    script = args.host_discovery_script
    if script is None:
        source = ["--hostfile", str(args.hostfile.resolve())] if args.hostfile else \
            ["--hosts", args.hosts or f"localhost:{args.ngpus}"]
        script = shlex.join([sys.executable, discovery.__file__, *source])
    flags = ["--min-np", str(args.min_np or args.ngpus), "--max-np", str(args.max_np or args.ngpus),
             "--host-discovery-script", script]
    for name in ("slots_per_host", "elastic_timeout", "reset_limit"):
        if getattr(args, name) is not None:
            flags += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.blacklist_cooldown_range:
        flags += ["--blacklist-cooldown-range", *map(str, args.blacklist_cooldown_range)]
    return flags


def without_unsafe_env(env):
    """runner's variables for an elastic run: those above left out."""
    return {key: value for key, value in env.items() if key not in ELASTIC_UNSAFE_ENV}


def drop_elastic_unsafe_env(environ):
    """Take the variables above out of ``environ`` (runner's own, which horovodrun passes on), saying so for each
    one the user had set."""
    for key in ELASTIC_UNSAFE_ENV:
        if key in environ:
            print(f"runner: note: elastic runs leave out {key}={environ.pop(key)} (Horovod 0.28.1 crashes when it "
                  "re-initialises after a reset with it set)", file=sys.stderr)


class ElasticDriverLog(logging.Filter):
    """Horovod's elastic driver logs to the root logger, its stops with a traceback: its lines are kept without
    one, and ``ended`` says in one line why the driver ended the run (too few workers for too long, too many
    resets; runner adds whether to resume), or is empty (a worker's failure ended it: its own line says why)."""

    def __init__(self):
        super().__init__()
        self.ended = ""

    def filter(self, record):
        if f"{os.sep}horovod{os.sep}runner{os.sep}" not in record.pathname or record.levelno < logging.ERROR:
            return True
        message, failure = record.getMessage(), record.exc_info and record.exc_info[1]
        if type(failure).__name__ == "TimeoutException":  # waiting for --min-np slots (driver.py)
            self.ended = ("the elastic run had fewer than --min-np workers for longer than --elastic-timeout; when "
                          "enough hosts are back, ")
        elif "reset count" in message:
            self.ended = "the elastic run changed its world more often than --reset-limit allows; "
        record.exc_info = record.exc_text = None
        return True


class ElasticProgress(logging.Handler):
    """Shows the elastic driver's progress (the slots it waits for, the workers it starts, hosts it blacklists,
    resets) as ``runner: elastic: ...`` lines, and every other WARNING or worse as Python's last-resort handler
    would (this handler replaces it on the root logger)."""
    SHOWN = ("driver.py", "discovery.py", "registration.py")

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record):
        from_driver = f"{os.sep}horovod{os.sep}runner{os.sep}elastic{os.sep}" in record.pathname
        if record.levelno >= logging.WARNING:
            line = self.format(record)
        elif from_driver and os.path.basename(record.pathname) in self.SHOWN and \
                record.getMessage().startswith(("wait for", "start worker", "blacklist", "reset workers")):
            line = f"runner: elastic: {record.getMessage()}"
        else:
            return
        print(line, file=sys.stderr, flush=True)


def record_elastic_drivers(gloo_run):
    """The elastic drivers horovodrun's gloo_run creates from now on (a list that fills), so that runner can stop
    one horovodrun left running: a TimeoutException from its first wait leaves the driver's discovery thread (a
    daemon) going (horovod/runner/gloo_run.py, launch_gloo_elastic, v0.28.1)."""
    drivers, base = [], gloo_run.ElasticDriver

    class RecordedDriver(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            drivers.append(self)
    gloo_run.ElasticDriver = RecordedDriver
    return drivers


def elastic_start_timeout(error):
    """One line for the elastic driver's wait for its first --min-np slots timing out (a TimeoutException that
    horovodrun raises as it is). Without --network-interface it also waits for a second host, to find the
    interfaces the hosts share (gloo_run.py _get_min_start_hosts; runner names lo itself when every host is this
    machine)."""
    if "two hosts" in str(error):
        return ("the elastic driver waited --elastic-timeout for --min-np slots on two hosts or more (it needs a "
                "second host to find a common network interface): check the hosts, or give --network-interface "
                "IFACE (lo when every host is this machine)")
    return ("the elastic driver waited --elastic-timeout for --min-np slots: check that the hosts (-H, --hostfile "
            "or --host-discovery-script's) are up and have free slots")
