"""Collectives: Horovod's allreduce over 2 processes (Gloo) and over every local GPU, exact."""
import json
import os
import subprocess
import sys

from selfcheck import GPU_CHECK, NOT_APPLICABLE


def allreduce_worker():
    """Run by horovodrun: every rank contributes (rank+1) * ones; the sum must be exact."""
    import horovod.mxnet as hvd
    import mxnet as mx
    hvd.init()
    ctx = mx.gpu(hvd.local_rank()) if mx.context.num_gpus() else mx.cpu()
    size = 1 << 20
    tensor = mx.nd.ones((size,), ctx=ctx) * (hvd.rank() + 1)
    hvd.allreduce_(tensor, average=False, name="gpu_check")
    expected = hvd.size() * (hvd.size() + 1) / 2
    exact = bool((tensor == expected).sum().asscalar() == size)
    print("ALLREDUCE " + json.dumps({"rank": hvd.rank(), "size": hvd.size(), "ctx": str(ctx), "exact": exact}),
          flush=True)


def run_allreduce(workers):
    from rn50kit.launch.launchers.horovodrun import horovodrun_path
    horovodrun = horovodrun_path()
    if horovodrun is None:
        return "fail", "horovodrun is not installed; run `make setup`", {}
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run([horovodrun, "-np", str(workers), "-H", f"localhost:{workers}", "--gloo",
                             sys.executable, GPU_CHECK, "--allreduce-worker"],
                            capture_output=True, text=True, timeout=600, env=env)
    reports = [json.loads(line.split("ALLREDUCE ", 1)[1]) for line in result.stdout.splitlines()
               if "ALLREDUCE " in line]
    found = {"reports": reports, "status": result.returncode}
    if result.returncode != 0 or len(reports) != workers:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        return "fail", f"horovodrun -np {workers} exited with {result.returncode}: {tail[0]}", found
    exact = all(r["exact"] for r in reports)
    where = ", ".join(sorted({r["ctx"] for r in reports}))
    return ("pass" if exact else "fail"), (f"{workers} ranks ({where}) summed 1M floats "
                                           f"{'exactly' if exact else 'WRONGLY'}"), found


def check_allreduce_cpu(machine, args):
    return run_allreduce(2)


def check_allreduce_gpu(machine, args):
    if machine.num_gpus < 2:
        return NOT_APPLICABLE, "one GPU: no traffic between GPUs to check", {}
    return run_allreduce(machine.num_gpus)
