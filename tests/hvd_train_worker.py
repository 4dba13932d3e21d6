"""Run by tests under horovodrun: train with train.py's own code, then dump this rank's parameters."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import train  # noqa: E402


def main():
    out_dir = sys.argv[1]
    args = train.get_args_parser().parse_args(sys.argv[2:])
    args.cmd = sys.argv
    import horovod.mxnet as hvd
    net_holder = {}
    original = train.models.get_model_from_args

    def keep_net(a):
        net_holder["net"] = original(a)
        return net_holder["net"]

    train.models.get_model_from_args = keep_net
    train.main(args)
    params = {name: p.data().asnumpy() for name, p in net_holder["net"].collect_params().items()}
    np.savez(os.path.join(out_dir, f"params-rank{hvd.rank()}.npz"), **params)


if __name__ == "__main__":
    main()
