"""The Faults flags: WatchdogConfig (--stall-timeout) and its argparse group; the watchdog itself is
rn50kit/reliability/watchdog.py."""
import dataclasses

from rn50kit.config.cli import config_defaults

DEFAULT_STALL_TIMEOUT = 600.0


@dataclasses.dataclass(frozen=True)
class WatchdogConfig:
    """The Faults flags' values."""
    stall_timeout: float = DEFAULT_STALL_TIMEOUT


def add_watchdog_args(parser):
    group = parser.add_argument_group("Faults")
    group.add_argument("--stall-timeout", type=float, metavar="SECONDS",
                       help="end the run when a worker makes no progress for this long (a rank stopped, hung or "
                            "gone: the others would wait in a collective for ever); longer than the slowest step, "
                            "validation pass or checkpoint save; 0: never")
    parser.set_defaults(**config_defaults(WatchdogConfig))
    return group
