"""Launching workers, without MXNet: runner's command line, its plan for a machine (checks, variables, command), the
launchers in one table (launchers/: horovodrun, elastic or not, mpirun, srun) and the supervision of a run. The
devices a run uses and the memory it needs are rn50kit.hardware's, shared with train.py."""
