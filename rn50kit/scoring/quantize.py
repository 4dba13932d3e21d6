"""INT8 scoring on the CPU: a float32 checkpoint quantized with oneDNN through mxnet.contrib.quantization.

The float32 network is calibrated on a stated number of training records (the ranges of every layer's output
are measured there), turned into oneDNN's fused INT8 graph (quantized convolution + BatchNorm + ReLU + add), and
saved beside the checkpoint as ``<checkpoint>.int8-<key>-symbol.json`` / ``-0000.params`` with a ``.json``
describing the calibration. The key covers everything the graph depends on (the checkpoint's bytes, the
calibration mode, data and amount, batch and image shape, MXNet's version), so a later run with the same settings
reuses the graph and a different checkpoint or calibration never does.
"""
import hashlib
import json
import logging
import os
import time
import warnings

import mxnet as mx

from rn50kit.common import backends, rules
from rn50kit.common.rules import cpu_flags
from rn50kit.graph.symbol_files import export
from rn50kit.reporting.report import write_json

log = logging.getLogger(__name__)

# MXNet 1.9.1's calibrated INT8 graph with convolution+residual-add fusion is wrong here: on a ResNet-18 trained on
# the digits its logits were 25 % off float32's (3 % without this fusion; top-1 agreement 98.9 % -> 99.2 %).
# MXNet reads the switch once, when the library loads: set it in the environment before `import mxnet`.
INT8_ENV = {"MXNET_DISABLE_MKLDNN_FUSE_CONV_SUM": "1"}
# oneDNN's INT8 convolutions need at least AVX2; VNNI (AVX512_VNNI or AVX_VNNI) makes them about twice as fast.
INT8_ISA = ("avx2", "avx512_vnni", "avx_vnni", "amx_int8")


def int8_unavailable(mode, ctxs, conv_layout, calib_batches, flags=None):
    """Why --dtype int8 cannot run here (one line), or None."""
    why = rules.dtype_problem("int8", mode, any(ctx.device_type != "cpu" for ctx in ctxs))
    if why:
        return why
    if not mx.runtime.Features().is_enabled("MKLDNN"):
        return "--dtype int8 needs MXNet built with oneDNN (mx.runtime.Features() lacks MKLDNN); pip install mxnet"
    flags = cpu_flags() if flags is None else flags
    if flags and not flags & set(INT8_ISA):
        return ("--dtype int8 needs a CPU with AVX2, AVX-512 VNNI or AMX (oneDNN's INT8 kernels); this one has none "
                "of them: score in float32")
    if conv_layout != "NCHW":
        return f"--dtype int8 needs --conv-layout NCHW (oneDNN's INT8 graph), got {conv_layout}"
    if calib_batches < 1:
        return f"--calib-batches must be positive, got {calib_batches}"
    return None


def vnni(flags=None):
    flags = cpu_flags() if flags is None else flags
    return bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})


def file_digest(path, chunk=1 << 22):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_key(checkpoint_digest, calibration, image_shape):
    """What the quantized graph depends on; any change gives another key."""
    parts = dict(checkpoint=checkpoint_digest, image_shape=list(image_shape), mxnet=mx.__version__,
                 switches={k: os.environ.get(k) for k in INT8_ENV},
                 calibration={k: calibration[k] for k in ("mode", "batches", "batch_size", "data")})
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def cache_prefix(checkpoint_path, key):
    stem = checkpoint_path[:-len(".params")] if checkpoint_path.endswith(".params") else checkpoint_path
    return f"{stem}.int8-{key}"


def describe_calibration(mode, batches, batch_size, data_source):
    """The calibration as the report states it (records is filled in once they are read)."""
    return {"mode": mode, "batches": batches, "batch_size": batch_size, "data": data_source, "records": 0}


def calibration_source(backend, data_train):
    """The training data named in the calibration description (a file's identity: path, size, time)."""
    if not backends.reads_records(backend):
        return backend
    if not data_train:
        return None
    stat = os.stat(data_train)
    modified = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stat.st_mtime))
    return f"{os.path.abspath(data_train)} ({stat.st_size} bytes, modified {modified})"


def calibration_iter(batches, max_batches):
    """The first ``max_batches`` batches (padding dropped) as an NDArrayIter for mxnet.contrib.quantization."""
    parts = []
    for i, batch in enumerate(batches):
        if i >= max_batches:
            break
        data = batch.data[0]
        valid = data.shape[0] - (batch.pad or 0)
        parts.append(data[:valid].as_in_context(mx.cpu()).astype("float32"))
    if not parts:
        raise ValueError("the calibration data is empty")
    data = mx.nd.concat(*parts, dim=0) if len(parts) > 1 else parts[0]
    return mx.io.NDArrayIter(data, batch_size=min(parts[0].shape[0], data.shape[0])), data.shape[0]


def quantize(net, data_shape, calibration, calib_batches_fn):
    """A quantized SymbolBlock of the float32 ``net``; fills calibration['records']."""
    from mxnet.contrib import quantization
    if calibration["mode"] == "entropy" and quantization.stats is None:  # train.py loads MXNet without SciPy
        from scipy import stats
        quantization.stats = stats
    if any(os.environ.get(k) != v for k, v in INT8_ENV.items()):
        log.warning("INT8 graph made with oneDNN's convolution+add fusion, which loses accuracy in MXNet 1.9.1: "
                    "set %s before MXNet is imported", " ".join(f"{k}={v}" for k, v in INT8_ENV.items()))
    calib_iter, records = calibration_iter(calib_batches_fn(), calibration["batches"])
    calibration["records"] = int(records)
    with warnings.catch_warnings():  # "Cannot decide type for data": the input's type is known at run time
        warnings.simplefilter("ignore", UserWarning)
        qnet = quantization.quantize_net_v2(net, quantized_dtype="auto", quantize_mode="full", calib_data=calib_iter,
                                            calib_mode=calibration["mode"], num_calib_examples=records,
                                            ctx=mx.cpu())
    qnet.hybridize(static_alloc=True, static_shape=True)
    qnet(mx.nd.zeros(data_shape)).wait_to_read()
    return qnet


def save(qnet, prefix, calibration):
    export(qnet, prefix)
    write_json(prefix + ".json", calibration, indent=2)  # last: its presence means the graph is complete


def load(prefix, data_shape):
    with open(prefix + ".json") as f:
        calibration = json.load(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        qnet = mx.gluon.SymbolBlock.imports(f"{prefix}-symbol.json", ["data"], f"{prefix}-0000.params", ctx=mx.cpu())
    qnet.hybridize(static_alloc=True, static_shape=True)
    qnet(mx.nd.zeros(data_shape)).wait_to_read()
    return qnet, calibration


def int8_net(net, checkpoint_path, data_shape, calibration, calib_batches_fn, is_primary=True, barrier=None):
    """The INT8 graph for ``net`` (float32, its checkpoint already loaded from ``checkpoint_path`` or None for
    fresh weights): reused from beside the checkpoint when it was made with the same settings, else calibrated,
    quantized and saved there (by the primary worker; the others wait and load it)."""
    if checkpoint_path is None:  # fresh weights (synthetic benchmark): nothing to key a saved graph on
        qnet = quantize(net, data_shape, calibration, calib_batches_fn)
        calibration.update(reused=False, graph=None)
        return qnet, calibration
    key = cache_key(file_digest(checkpoint_path), calibration, data_shape[1:])
    prefix = cache_prefix(checkpoint_path, key)
    if is_primary and not os.path.isfile(prefix + ".json"):
        qnet = quantize(net, data_shape, calibration, calib_batches_fn)
        try:
            save(qnet, prefix, calibration)
        except OSError as error:  # a read-only checkpoint folder: score anyway, say why nothing is kept
            log.warning("Cannot save the INT8 graph beside the checkpoint (%s); it is made afresh next time", error)
            prefix = None
        if barrier:
            barrier()
        calibration.update(reused=False, graph=prefix and prefix + "-symbol.json")
        return qnet, calibration
    if barrier:
        barrier()
    if not os.path.isfile(prefix + ".json"):  # the primary could not save it: make this worker's own
        qnet = quantize(net, data_shape, calibration, calib_batches_fn)
        calibration.update(reused=False, graph=None)
        return qnet, calibration
    qnet, calibration = load(prefix, data_shape)
    calibration.update(reused=True, graph=prefix + "-symbol.json")
    return qnet, calibration


def summary(calibration):
    """One line for the log: how the INT8 graph was calibrated."""
    asked = calibration['batches'] * calibration['batch_size']
    counts = f"{calibration['batches']} batches of {calibration['batch_size']}" if calibration['records'] >= asked \
        else (f"fewer than the {calibration['batches']} batches of {calibration['batch_size']} asked for: the data "
              f"has {calibration['records']}")
    how = f"{calibration['mode']} calibration on {calibration['records']} training records ({counts}) from " \
          f"{calibration['data']}"
    where = "reused from " if calibration.get("reused") else ("saved to " if calibration.get("graph") else "")
    return f"INT8 graph (oneDNN): {how}; {where}{calibration.get('graph') or 'not saved (no checkpoint)'}"
