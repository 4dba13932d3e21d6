"""The world of workers a launcher started (from the variables it sets) and the check that Horovod joined it.

A Horovod built without MPI, started by mpirun or srun, makes every process a world of one: N trainings run
alone, on the same data, writing the same checkpoints, and nothing fails. Each worker compares the two right
after hvd.init(). No MXNet here: runner and the tests import it cheaply.
"""
import os
import sys

MPI_ADVICE = ("install Open MPI (Debian/Ubuntu: `apt-get install openmpi-bin libopenmpi-dev`; on a cluster: "
              "`module load openmpi` or your site's MPI module) and rerun `make setup` so Horovod is built with MPI")

# (launcher, its size, rank and local-rank variables), the most specific first: mpirun run inside a Slurm
# allocation, or horovodrun inside an srun step, sets its own variables on top of the outer launcher's.
LAUNCHERS = (
    ("horovodrun", "HOROVOD_SIZE", "HOROVOD_RANK", "HOROVOD_LOCAL_RANK"),
    ("mpirun", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),  # Open MPI
    ("mpiexec or srun (PMI)", "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID"),  # MPICH/Intel MPI (Hydra), srun --mpi=pmi2
    ("srun", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID"),  # set in an srun step, not in sbatch's script
)


class LaunchedWorld:
    def __init__(self, launcher, size, rank, local_rank):
        self.launcher = launcher
        self.size = size
        self.rank = rank
        self.local_rank = local_rank  # None when the launcher does not say


def launched_world(environ):
    """The world the launcher that started this process meant, or None when no launcher's variables are set."""
    for launcher, size, rank, local_rank in LAUNCHERS:
        if environ.get(size, "").isdigit() and environ.get(rank, "").isdigit():
            local = environ.get(local_rank, "")
            local = int(local) if local.isdigit() else None
            return LaunchedWorld(launcher, int(environ[size]), int(environ[rank]), local)
    return None


def world_mismatch(size, rank, local_rank, mpi_built, environ):
    """Why Horovod's world (size, rank, local_rank) is not the one the launcher started, or None if it is."""
    meant = launched_world(environ)
    if meant is None or (meant.size, meant.rank) == (size, rank) and meant.local_rank in (None, local_rank):
        return None
    seen = f"{meant.launcher} started {meant.size} workers (this one rank {meant.rank}), but Horovod joined " \
           f"a world of {size} (rank {rank}, local rank {local_rank})"
    if size == 1 and not mpi_built:
        return f"{seen}: this Horovod was built without MPI, so each worker trains alone; {MPI_ADVICE}, " \
               "or start the workers with runner's default launcher (horovodrun, Gloo)"
    if size == 1 and environ.get("HOROVOD_CONTROLLER", "").lower() == "gloo" and meant.launcher != "horovodrun":
        return f"{seen}: HOROVOD_CONTROLLER=gloo makes Horovod ignore {meant.launcher}'s world (Gloo needs " \
               "horovodrun's rendezvous); unset it, or start the workers with runner's default launcher"
    if size == 1 and meant.launcher == "srun":
        return f"{seen}: srun did not connect the tasks through PMIx; run `srun --mpi=pmix ...` " \
               "(`srun --mpi=list` shows what this Slurm offers)"
    return f"{seen}: start each worker once, through one launcher (runner's --launcher names which one)"


def check_joined(size, rank, local_rank, mpi_built, environ=os.environ):
    """Stop this worker unless Horovod joined the launcher's world. When every worker is alone (the usual
    failure), only the launcher's rank 0 prints the line, so N workers give one message, not N."""
    problem = world_mismatch(size, rank, local_rank, mpi_built, environ)
    if problem:
        if launched_world(environ).rank == 0 or size != 1:
            print(f"train.py: error: {problem}", file=sys.stderr, flush=True)
        sys.exit(2)
