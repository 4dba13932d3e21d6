"""What runner asks of a launcher: its checks, the variables and the command prefix it needs, where its workers run,
and how it starts them. Each launcher is a subclass in its own module, and one row of the table
(launchers/__init__.py); the defaults here are those of a launcher that runner starts on this machine."""
import os

from rn50kit.config.cli import UsageError
from rn50kit.launch import horovod_build
from rn50kit.reliability import world


class Launcher:
    name = ""  # --launcher's value
    help = ""  # what it is, for --launcher's help
    elastic = False  # runs elastic runs (horovodrun's driver: workers that come and go)
    places_workers = False  # it, not runner, placed the workers (srun): how many run here and where is its

    def check(self, args, environ):
        """Refuse, before anything starts, what this launcher cannot run (asked for --kv-store horovod, once
        Horovod is known to load)."""

    def workers_on_this_node(self, args, environ):
        """How many of the workers run on this machine when no host list says."""
        return args.ngpus

    def env(self, args):
        """The variables this launcher's workers need from runner: --network-interface for Open MPI's TCP
        transport (mpirun passes OMPI_MCA_* on to its daemons and workers) and NCCL."""
        if not args.network_interface:
            return {}
        return {"OMPI_MCA_btl_tcp_if_include": args.network_interface,
                "OMPI_MCA_oob_tcp_if_include": args.network_interface, "NCCL_SOCKET_IFNAME": args.network_interface}

    def prefix(self, args, env):
        """The command line before train.py's (``env``: the variables runner sets); none: train.py runs as is."""
        return []

    def supervises(self, args):
        """Whether runner starts this launcher as a child and watches the run (supervision.supervise), rather than
        becoming the one process of --kv-store device (run_alone)."""
        return args.kv_store == "horovod"

    def start(self, args, command):
        """Run ``command`` to its end: a supervision.Ended."""
        raise NotImplementedError

    def run_alone(self, command, workspace):
        """Become ``command``: the one process of --kv-store device is the worker, so its own exit status is the
        truth (0 after a signal stop that saved a checkpoint)."""
        os.execvp(command[0], command)


def require_horovod_mpi(launcher_name):
    """mpirun and srun start the workers themselves: Horovod must be built with MPI to join them into one world
    (else each trains alone)."""
    if not horovod_build.horovod_has_mpi():
        raise UsageError(f"--launcher {launcher_name} needs Horovod built with MPI, and this one has none (each "
                         f"worker would train alone); {world.MPI_ADVICE}, or use --launcher horovod")
