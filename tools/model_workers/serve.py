"""A worker process: its steps built, then timed, warmed up or its ceiling measured again on each request of the
driver (a line on stdin, a JSON line on stdout)."""
import json
import sys

from model_workers.mxnet_steps import mxnet_steps
from model_workers.timing import timed
from model_workers.torch_steps import torch_steps
from rn50kit.common import steady


def worker(kind, model, batch_size, image_size, fuse_bn_relu=False):
    """Build the steps, say which (with a first measure of each ceiling), then on each stdin line time the step
    asked for ('KEY\\titers\\twarmup': images/s), warm it up until steady ('warm\\tKEY\\tminimum\\tmaximum\\t
    tolerance': steady.warm_up's result) or measure a ceiling again ('ceiling\\tPRECISION': GFLOP/s)."""
    version = unavailable = built = logits = None
    if kind == "torch":
        steps, ceilings, version, unavailable = torch_steps(batch_size, image_size)
    else:
        steps, ceilings, unavailable, built, logits = mxnet_steps(kind, model, batch_size, image_size, fuse_bn_relu)
    print(json.dumps({"steps": list(steps), "ceilings": {p: measure() for p, measure in ceilings.items()},
                      "version": version, "unavailable": unavailable, "built": built, "logits": logits}), flush=True)
    for line in sys.stdin:
        fields = line.rstrip("\n").split("\t")
        if fields[0] == "ceiling":
            print(json.dumps({"rate": ceilings[fields[1]]()}), flush=True)
            continue
        if fields[0] == "warm":
            key, minimum, maximum, tolerance = fields[1:]
            print(json.dumps(steady.warm_up(steps[key], int(minimum), int(maximum), tolerance=float(tolerance))),
                  flush=True)
            continue
        key, iters, warmup = fields
        print(json.dumps({"ips": timed(steps[key], batch_size, int(iters), int(warmup))}), flush=True)
