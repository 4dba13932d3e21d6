"""BatchNorm folded into the convolutions before a bfloat16 cast, with every value rounded to bfloat16 first:
what keeps oneDNN's bfloat16 graph as close to float32 as MXNet's own unfused one (docs/scoring.md)."""
import json
import warnings

import mxnet as mx
import numpy as np

from rn50kit.graph.symbol_files import without_amp_casts


def round_to_bfloat16(values):
    """float32 values rounded to the nearest bfloat16 (ties to even), kept as float32: any later cast to bfloat16,
    rounding or truncating, leaves them as they are."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(values), values, rounded)  # a NaN's bits could carry into another value


def _attr_true(attrs, name, default):
    """A boolean attribute of a node in MXNet's graph JSON, where it is a string ("True", "true", "1")."""
    return attrs.get(name, default) in ("True", "true", "1")


def fold_batchnorm(net, sample):
    """``net``'s graph as a new SymbolBlock (``net`` unchanged) whose convolutions carry their BatchNorm's scale and
    shift, folded in float32, every value that will be cast to bfloat16 already rounded to it (round_to_bfloat16).

    Why: oneDNN's fusion in MXNet 1.9 folds BatchNorm into a bfloat16 convolution itself, and its float-to-bfloat16
    cast truncates (mshadow's bf16_t keeps the upper 16 bits), shrinking every weight and bias toward zero in every
    layer: ResNet-50's logits moved 6 % from float32's, against 1.2 % without the fusion. Here each BatchNorm is
    left with mean 0, variance 1 and a gamma of just over sqrt(1 + eps): the fusion's factor is 1 (or a hair above),
    and its truncation gives back the rounded values unchanged. A BatchNorm with fix_gamma, or after a convolution
    whose output is also used elsewhere, is left to MXNet. ``net``'s parameter values are not changed.
    """
    net.hybridize(static_alloc=True, static_shape=True)
    net(sample).wait_to_read()  # the graph is traced; where the forward pass fails, it fails here
    inputs, symbol = net._cached_graph
    graph = json.loads(without_amp_casts(symbol).tojson(remove_amp_cast=False))
    nodes = graph["nodes"]
    uses = {}
    for source in [entry for node in nodes for entry in node["inputs"]] + graph["heads"]:
        uses[source[0]] = uses.get(source[0], 0) + 1
    values = {name: param.data().asnumpy() for name, param in net.collect_params().items()}
    name_of = lambda entry: nodes[entry[0]]["name"]  # noqa: E731
    for node in nodes:
        conv = nodes[node["inputs"][0][0]] if node["op"] == "BatchNorm" else None
        attrs = node.get("attrs", {})
        if conv is None or conv["op"] != "Convolution" or uses[node["inputs"][0][0]] != 1 or \
                _attr_true(attrs, "fix_gamma", "True"):
            continue  # only a convolution feeding nothing but its BatchNorm (with a gamma) can take it in
        gamma, beta, mean, var = (name_of(entry) for entry in node["inputs"][1:5])
        eps = float(attrs.get("eps", 1e-3))
        scale = values[gamma].astype(np.float64) / np.sqrt(values[var].astype(np.float64) + eps)
        shift = values[beta] - scale * values[mean]
        source = nodes[conv["inputs"][1][0]]
        if source["op"] == "Concat":  # EvenChannelStem: the parameter, then zeros, along the input channels
            source = nodes[source["inputs"][0][0]]
        weight = source["name"]
        w = values[weight]
        values[weight] = round_to_bfloat16(w * scale.reshape((-1,) + (1,) * (w.ndim - 1)))
        if not _attr_true(conv.get("attrs", {}), "no_bias", "False"):
            bias = name_of(conv["inputs"][2])
            shift = shift + scale * values[bias]
            values[bias] = np.zeros_like(values[bias])
        values[beta] = round_to_bfloat16(shift)
        values[mean] = np.zeros_like(values[mean])
        values[var] = np.ones_like(values[var])
        values[gamma] = np.full_like(values[gamma], np.nextafter(np.float32(np.sqrt(1.0 + eps)), np.float32(2)))
    for node in nodes:  # the classifier's (and any other) operands AMP will cast
        if node["op"] in ("Convolution", "FullyConnected"):
            for entry in node["inputs"][1:]:
                if nodes[entry[0]]["op"] == "null":
                    values[name_of(entry)] = round_to_bfloat16(values[name_of(entry)])
    with warnings.catch_warnings():  # "Cannot decide type for data": known only at run time
        warnings.simplefilter("ignore", UserWarning)
        folded = mx.gluon.SymbolBlock(symbol, inputs)
    ctx = sample.context
    for name, param in folded.collect_params().items():
        param._load_init(mx.nd.array(values[name], dtype=values[name].dtype, ctx=ctx), ctx)
    folded.hybridize(static_alloc=True, static_shape=True)
    folded(sample)
    return folded
