"""Stands in for train.py beside a copy of runner in tests/e2e/test_launchers.py: runs the kit's own train.main,
then writes what this worker saw (Horovod's world, the launcher's variables, the SSH session it came through)
and its trained parameters to the workspace, as world-rank<R>.json and params-rank<R>.npz."""
import json
import os
import sys

# Not this file's folder: `import train` must find the kit's train.py (through PYTHONPATH), not this stand-in.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [path for path in sys.path if os.path.abspath(path or ".") != HERE]

import numpy as np  # noqa: E402

import train  # noqa: E402
from rn50kit.reliability import world  # noqa: E402


def check_flags(argv, launch=None):
    """runner's flag check imports this stand-in as `train` (it sits where train.py would): the kit's own check runs
    when train.main parses the flags in the workers, and tests/e2e/test_user_path.py tests runner's (``launch``:
    runner's description of the run, for start_checks.check_before_start)."""


def main():
    args = train.parse_args(sys.argv[1:])
    outcome = train.main(args, sys.argv)

    import horovod.mxnet as hvd
    launched = world.launched_world(os.environ)
    seen = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
            "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
            "mpi_enabled": hvd.mpi_enabled(), "gloo_enabled": hvd.gloo_enabled(),
            "launcher": launched.launcher if launched else None,
            "ssh_connection": os.environ.get("SSH_CONNECTION"),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "interfaces": {key: os.environ.get(key) for key in
                           ("HOROVOD_GLOO_IFACE", "NCCL_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_include")}}
    with open(os.path.join(args.workspace, f"world-rank{hvd.rank()}.json"), "w") as f:
        json.dump(seen, f)
    params = {name: p.data().asnumpy() for name, p in outcome.net.collect_params().items()}
    np.savez(os.path.join(args.workspace, f"params-rank{hvd.rank()}.npz"), **params)


if __name__ == "__main__":
    main()
