"""The launchers runner starts the workers with, in one table (--launcher's choices): each one a subclass of
base.Launcher in its own module. Adding a launcher means its module and a row here; nothing else compares launcher
names."""
from rn50kit.launch.launchers.horovodrun import HOROVODRUN
from rn50kit.launch.launchers.mpirun import MPIRUN
from rn50kit.launch.launchers.srun import SRUN

LAUNCHERS = {launcher.name: launcher for launcher in (HOROVODRUN, MPIRUN, SRUN)}
NAMES = list(LAUNCHERS)
*_FIRST, _LAST = (launcher.help for launcher in LAUNCHERS.values())
HELP = f"{', '.join(_FIRST)}, or {_LAST}"  # --launcher's


def get(name):
    """The launcher of --launcher ``name`` (the parser's choices: a name not here is refused before)."""
    return LAUNCHERS[name]
