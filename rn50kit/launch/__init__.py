"""Launching workers, without MXNet: runner's command line, its plan for a machine (checks, variables, command), the
launchers in one table (launchers/: horovodrun, elastic or not, mpirun, srun), the supervision of a run, the devices
a run uses and the memory a configuration needs."""
