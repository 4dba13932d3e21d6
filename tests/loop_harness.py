"""The training loop of fit.py driven in-process on one CPU context, as train.py builds it: the run's description,
and the (state, loop) pair for a FitConfig and a network (the fixture that restores the signal handlers fit.py
installs, keep_signal_handlers, is in conftest.py)."""
import mxnet as mx

from rn50kit.training import distributed
import fit
from rn50kit.training import precision
from rn50kit.training.state import RunInfo
from rn50kit.training.stop_signals import StopFlag

CPU = [mx.cpu()]
RUN = RunInfo(model_name="tiny", arch="resnetv15", command=["test"], report_path="report.json",
              record={"args": {}})


def start(cfg, net, num_classes):
    """fit.prepare's state and a Loop for ``net`` on the CPU, alone (no Horovod), without outputs."""
    dist = distributed.Distributed(None)
    state = fit.prepare(cfg, RUN, net, CPU, dist)
    loop = fit.Loop(net=net, ctxs=CPU, dist=dist, stop=StopFlag(dist), guard=precision.StatsGuard(net),
                    end_epoch=cfg.num_epochs, num_classes=num_classes)
    return state, loop
