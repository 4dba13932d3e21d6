"""train.py's flags checked before any worker starts, by train.py's own parser and checks (train.check_flags), in
a Python that imports train: one line for an unknown or bad flag, and the run's checkpoint prefix."""
import json
import os
import subprocess
import sys


def train_arguments(command):
    """The arguments train.py gets in ``command`` (runner's own flags turned into train.py's, and the user's)."""
    at = next(i for i, part in enumerate(command) if os.path.basename(str(part)) == "train.py")
    return [str(part) for part in command[at + 1:]]


def check_train_flags(extra, kit_dir, launch=None):
    """An unknown or bad train.py flag or hyper-parameter and, given ``launch`` (plan.launch_description's), what
    train.check_before_start knows before any worker starts: train.py's one-line message, once, before any
    worker starts (and in a dry run). Returns the run's checkpoint prefix (None: it does not train)."""
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
