"""A hybridized network as ``<prefix>-symbol.json`` + ``<prefix>-NNNN.params`` and back, without MXNet 1.9.1's
leak of AMP's cast-free graph copies."""
import ctypes
import os
import warnings

import mxnet as mx


def load_checkpoint(prefix, epoch, ctx=None):
    """Load `<prefix>-symbol.json` + `<prefix>-NNNN.params` (as written by ``export``) as a SymbolBlock."""
    symbol_file, params_file = f"{prefix}-symbol.json", f"{prefix}-{epoch:04d}.params"
    for path in (symbol_file, params_file):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no checkpoint file {path}")
    with warnings.catch_warnings():  # "Cannot decide type for data": the input's type is only known at run time
        warnings.simplefilter("ignore", UserWarning)
        return mx.gluon.SymbolBlock.imports(symbol_file, ["data"], params_file, ctx=ctx or mx.cpu())


def without_amp_casts(symbol):
    """``symbol`` without AMP's cast operators, as a Symbol that frees its graph when dropped. MXNet 1.9.1's
    Symbol.save and tojson (and so HybridBlock.export) remove them into a handle they never free: a copy of the
    graph per call, 112 KiB for ResNet-18, which made rank 0's memory creep by a checkpoint each epoch."""
    handle = mx.base.SymbolHandle()
    mx.base.check_call(mx.base._LIB.MXSymbolRemoveAmpCast(symbol.handle, ctypes.byref(handle)))
    return mx.sym.Symbol(handle)


def export(net, prefix, epoch=0):
    """Write `<prefix>-symbol.json` (without AMP's casts) and `<prefix>-NNNN.params`, as HybridBlock.export does,
    without its leak (without_amp_casts); the net must be hybridized and have run."""
    net.export(prefix, epoch=epoch, remove_amp_cast=False)
    without_amp_casts(net._cached_graph[1]).save(f"{prefix}-symbol.json", remove_amp_cast=False)
    return f"{prefix}-symbol.json", f"{prefix}-{epoch:04d}.params"
