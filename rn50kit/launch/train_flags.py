"""train.py's flags checked before any worker starts: first in this process by train.py's own parser and checks,
which need no MXNet (rn50kit.config.train_flags), then, for a launch, what needs the machine, the data or a
checkpoint's file in a Python that imports train (train.check_flags): one line for an unknown or bad flag, and the
run's checkpoint prefix."""
import json
import os
import subprocess
import sys

from rn50kit.config import train_flags as flags


def train_arguments(command):
    """The arguments train.py gets in ``command`` (runner's own flags turned into train.py's, and the user's)."""
    at = next(i for i, part in enumerate(command) if os.path.basename(str(part)) == "train.py")
    return [str(part) for part in command[at + 1:]]


def check_train_flags(extra, kit_dir, launch=None):
    """An unknown or bad train.py flag or hyper-parameter and, given ``launch`` (plan.launch_description's), what
    start_checks.check_before_start knows before any worker starts: train.py's one-line message, once, before any
    worker starts (and in a dry run). Returns the run's checkpoint prefix (None: it does not train)."""
    flags.check(extra, elastic=bool(launch and launch.get("elastic")))
    if launch is None:
        return None
    check = subprocess.run([sys.executable, "-c", "import json, sys; sys.path.insert(0, sys.argv.pop(1)); "
                            "import train; train.check_flags(sys.argv[2:], json.loads(sys.argv[1]))", str(kit_dir),
                            json.dumps(launch), *extra], stdout=subprocess.PIPE, text=True)
    lines, answer = check.stdout.splitlines(), {}
    if check.returncode == 0 and launch and lines and lines[-1].startswith('{"checkpoint_prefix"'):
        answer = json.loads(lines.pop())
    if lines:
        print("\n".join(lines))
    if check.returncode != 0:
        sys.exit(check.returncode)
    return answer.get("checkpoint_prefix")
