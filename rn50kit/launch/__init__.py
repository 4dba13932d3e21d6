"""Launching workers, without MXNet: runner's plans for horovodrun, mpirun and srun, the devices and the world of
workers, and the memory a configuration needs."""
