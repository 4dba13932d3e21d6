"""A network's parameters: a params file of the kit (``export``'s ``arg:``/``aux:`` keys, or
``save_parameters``' structural names) loaded into a built network, whatever the file's and the network's dtype,
layout and stem channels; the BatchNorm running statistics the training loop averages and checks."""
import os

import mxnet as mx


def load_parameters(net, path, ctx):
    """Load a params file written by ``export`` (``arg:``/``aux:`` keys) or ``save_parameters`` into ``net``, on
    ``ctx`` (a context or a list: an initialised network must get exactly the contexts it was initialised on).

    The saved dtype may differ from the network's (float16 <-> float32): values are cast to the network's.
    A 3-channel stem is zero-padded for a 4-channel network (the fourth input channel is the zero padding).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no parameter file {path}")
    saved = {key.split(":", 1)[-1]: value for key, value in mx.nd.load(path).items()}
    params = dict(net.collect_params().items())
    if set(saved) != set(params):
        # save_parameters() files use structural names (features.1.weight); those load the Gluon way.
        structural = net._collect_params_with_prefix()
        if set(saved) != set(structural):
            missing = sorted(set(params) - set(saved))[:3]
            extra = sorted(set(saved) - set(params))[:3]
            raise ValueError(f"{path} does not fit {net.__class__.__name__}: missing {missing}, unexpected {extra}")
        params = structural
    # NHWC convolutions keep weights as (O, kh, kw, I): convert when the file and the network differ.
    # The stem's weight (64, C, 7, 7) or (64, 7, 7, C) tells the file's layout without ambiguity.
    stem = [value for key, value in saved.items() if params[key].name == "conv0_weight"]
    saved_layout = "NHWC" if stem and stem[0].shape[1] == stem[0].shape[2] == 7 else "NCHW"
    net_layout = getattr(net, "layout", "NCHW")
    for key, value in saved.items():
        param = params[key]
        if value.ndim == 4 and saved_layout != net_layout:
            value = value.transpose((0, 2, 3, 1) if net_layout == "NHWC" else (0, 3, 1, 2))
        if param.shape and tuple(param.shape) != value.shape:
            value = _adapt_stem(param.name, value, param.shape, path, net_layout)
        param._load_init(value.astype(param.dtype), ctx, cast_dtype=True, dtype_source="current")


def _adapt_stem(name, value, shape, path, layout):
    """Zero-pad (or cut) the stem's input channels: a 3-channel checkpoint in a 4-channel network and back."""
    axis = 3 if layout == "NHWC" else 1
    same_elsewhere = all(value.shape[i] == shape[i] for i in range(4) if i != axis)
    if name == "conv0_weight" and same_elsewhere and {value.shape[axis], shape[axis]} <= {3, 4}:
        keep = min(shape[axis], value.shape[axis])
        kept = value.slice_axis(axis=axis, begin=0, end=keep)
        if keep == shape[axis]:
            return kept
        pad_shape = list(shape)
        pad_shape[axis] = shape[axis] - keep
        return mx.nd.concat(kept, mx.nd.zeros(pad_shape, dtype=value.dtype), dim=axis)
    raise ValueError(f"{path}: parameter {name} has shape {value.shape}, the network needs {tuple(shape)}")


def running_stats(net):
    """The BatchNorm running means and variances of ``net``, in a fixed order."""
    return [p for name, p in sorted(net.collect_params().items())
            if name.endswith("running_mean") or name.endswith("running_var")]
