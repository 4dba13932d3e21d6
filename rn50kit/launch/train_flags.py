"""train.py's flags checked before any worker starts, in runner's process and without MXNet: train.py's own parser
and checks (rn50kit.config.train_flags), then, for a launch, what needs the machine, the data or a checkpoint's
file (start_checks.check_launch): one line for an unknown or bad flag, and the run's checkpoint prefix."""
import os

from rn50kit.config import train_flags as flags


def train_arguments(command):
    """The arguments train.py gets in ``command`` (runner's own flags turned into train.py's, and the user's)."""
    at = next(i for i, part in enumerate(command) if os.path.basename(str(part)) == "train.py")
    return [str(part) for part in command[at + 1:]]


def check_train_flags(extra, launch=None):
    """An unknown or bad train.py flag or hyper-parameter and, given ``launch`` (plan.launch_description's), what
    start_checks.check_launch knows before any worker starts: train.py's one-line message, once, before any
    worker starts (and in a dry run). Returns the run's checkpoint prefix (None: it does not train)."""
    flags.check(extra, elastic=bool(launch and launch.get("elastic")))
    if launch is None:
        return None
    from rn50kit.training import start_checks  # the data, the workspace and the checkpoint's modules
    return start_checks.check_launch(extra, launch)
