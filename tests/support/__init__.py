"""What the tests share, a module per purpose (tests/conftest.py holds only the fixtures and pytest's hooks):

- processes: the kit's commands run as a user runs them, runs in the background, polling waits with a hang guard
- datasets: small real RecordIO files, photos and folders, the digits, tools/check_dataset.py on planted faults
- runs: train.py's and runner's flags for the tests' small runs, their plans and refusals, a run's log and report
- loop: fit.py's training loop driven in-process on a tiny network
- networks: models.py's flags and small random networks, what this CPU computes in bfloat16
- weights: published weights against an independent reference forward pass (resnet_reference), exported ones
- checkpoints: checkpoint files as checkpoint.save names them
- cluster: the launchers' services (Open MPI, Slurm, sshd on two loopback hosts)
- docs: the docs' command blocks
- fused_standins: NVIDIA's fused BatchNorm ops, stood in for from upstream MXNet's
- workers/: scripts the tests start as processes (Horovod workers, the fuzzers, a stand-in train.py)

Only the modules that need MXNet import it, so a test file that runs the kit's commands collects without it."""
