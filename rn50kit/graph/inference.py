"""Inference-only views of a trained network: oneDNN's fused float32 graph and the bfloat16 graph through MXNet
AMP; both return float32 logits."""
import warnings

import mxnet as mx
from mxnet.gluon import nn

from rn50kit.graph.batchnorm_fold import fold_batchnorm


def optimize_for_inference(net, data_shape, ctx=None):
    """An inference-only view of an initialised network with oneDNN's graph fusions (conv+BN+ReLU, conv+add).

    It shares ``net``'s parameters (``net`` itself is not changed and still trains); it uses the BatchNorm
    running statistics. On builds without oneDNN the plain hybridized graph is returned.
    """
    ctx = ctx or mx.cpu()
    data = mx.sym.var("data")
    with warnings.catch_warnings():  # "Cannot decide type for data": known only at run time
        warnings.simplefilter("ignore", UserWarning)
        view = mx.gluon.SymbolBlock(Float32Logits(net)(data), data, params=net.collect_params())
    sample = mx.nd.zeros(data_shape, ctx=ctx)
    if mx.runtime.Features().is_enabled("MKLDNN"):
        view.optimize_for(sample, backend="MKLDNN", static_alloc=True, static_shape=True)
    else:
        view.hybridize(static_alloc=True, static_shape=True)
    view(sample).wait_to_read()
    return view


def to_bfloat16(net, data_shape, ctx=None):
    """A bfloat16 inference copy of a hybridized, initialised float32 network (MXNet AMP graph conversion), through
    oneDNN's fusions (convolution+BatchNorm+ReLU, the residual add) where MXNet has oneDNN.

    Convolutions and the classifier run in bfloat16 on oneDNN, with the parameters cast once; the input stays
    float32 and the logits are returned as float32. The fusion comes after the cast (AMP's lists keep oneDNN's
    fused convolutions, ``_sg_mkldnn_conv``, in float32), with BatchNorm already folded into the convolutions in
    float32 (``fold_batchnorm``). ``net`` itself is not changed.
    """
    from mxnet.contrib import amp
    ctx = ctx or mx.cpu()
    sample = mx.nd.zeros(data_shape, ctx=ctx)
    onednn = mx.runtime.Features().is_enabled("MKLDNN")
    folded = fold_batchnorm(net, sample) if onednn else net
    with warnings.catch_warnings():  # "Cannot decide type for data": known only at run time
        warnings.simplefilter("ignore", UserWarning)
        converted = amp.convert_hybrid_block(folded, target_dtype="bfloat16", ctx=ctx, cast_optional_params=True)
    if onednn:
        converted.optimize_for(sample, backend="MKLDNN", static_alloc=True, static_shape=True)
    else:
        converted.hybridize(static_alloc=True, static_shape=True)
    # Not hybridized: its own graph would be traced from the unfused one. The cast of the logits runs alone.
    return Float32Logits(converted)


class Float32Logits(nn.HybridBlock):
    """``block``'s output cast to float32 (the logits every dtype's network returns)."""

    def __init__(self, block, **kwargs):
        super().__init__(prefix="", **kwargs)
        self.block = block

    def hybrid_forward(self, F, x):
        return F.cast(self.block(x), dtype="float32")
