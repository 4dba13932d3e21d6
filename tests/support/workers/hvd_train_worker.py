"""Run by tests under horovodrun: train with train.py's own code, then dump this rank's parameters."""
import os
import sys

import numpy as np

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.dirname(TESTS), TESTS]  # the kit's modules, and tests/support
import train  # noqa: E402


def main():
    out_dir = sys.argv[1]
    args = train.parse_args(sys.argv[2:])
    import horovod.mxnet as hvd
    outcome = train.main(args, sys.argv)
    params = {name: p.data().asnumpy() for name, p in outcome.net.collect_params().items()}
    np.savez(os.path.join(out_dir, f"params-rank{hvd.rank()}.npz"), **params)


if __name__ == "__main__":
    main()
