"""One worker's place in the run: Horovod's world (or this process alone), its console, and the contexts it
computes on."""
import os
import sys

from rn50kit.config.cli import UsageError
from rn50kit.hardware import devices
from rn50kit.reliability import faults, watchdog, world
from rn50kit.training.distributed import Distributed


def start_worker(kv_store, stall_timeout, as_script):
    """This process's place in the run (Horovod's world for --kv-store horovod, else this process alone); a worker
    started as a script (``as_script``: train.py run, not imported) gets faults' record and the watchdog; then
    rank 0's console (attach_console)."""
    hvd = None
    if kv_store == "horovod":
        import horovod.mxnet as hvd
        hvd.init()  # one process per worker; works alone too (size 1)
        world.check_joined(hvd.size(), hvd.rank(), hvd.local_rank(), hvd.mpi_built())  # the launcher's world?
    dist = Distributed(hvd)
    dist.elastic = hvd is not None and os.environ.get("HOROVOD_ELASTIC") == "1"  # horovodrun --min-np/--max-np
    if as_script:  # faults: a worker's record for runner, and a watchdog on a stalled run
        faults.install(dist.rank)
        watchdog.start(stall_timeout, dist.rank)
    attach_console(dist.rank)
    return dist


def attach_console(rank):
    """Rank 0 under runner on a terminal: write straight to it (RN50_CONSOLE names it), so the progress bar is
    live and lines carry no launcher prefix; horovodrun would pipe and prefix every line."""
    console = os.environ.get("RN50_CONSOLE")
    if rank != 0 or not console:
        return
    try:
        fd = os.open(console, os.O_WRONLY | os.O_NOCTTY)
    except OSError:
        return  # another machine, or gone: the launcher's pipes still carry the output
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)


def contexts(fit_cfg, local_rank, local_size, num_gpus=None, environ=None):
    """The contexts this process computes on: the GPUs --gpus selects (devices.select_gpus: one rule for every
    --kv-store, under runner's CUDA_VISIBLE_DEVICES too), else CPU contexts. ``num_gpus``/``environ``: MXNet's
    GPU count and os.environ unless described."""
    import mxnet as mx
    num_gpus = mx.context.num_gpus() if num_gpus is None else num_gpus
    if num_gpus == 0:
        if fit_cfg.gpus:
            raise UsageError(f"--gpus {fit_cfg.gpus}, but this process sees no GPU; leave --gpus out on a CPU")
        return [mx.cpu()] if fit_cfg.kv_store == "horovod" else [mx.cpu(i) for i in range(fit_cfg.cpu_contexts)]
    try:
        ordinals = devices.select_gpus(fit_cfg.gpus, fit_cfg.kv_store, local_rank, local_size, num_gpus,
                                       os.environ if environ is None else environ)
    except ValueError as error:
        raise UsageError(str(error))
    return [mx.gpu(i) for i in ordinals]
