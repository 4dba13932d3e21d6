"""Export a checkpoint (`<prefix>-symbol.json` + `<prefix>-NNNN.params`) to ONNX and check it with onnxruntime.

    python tools/export_onnx.py runs/demo/model 16

The input shape is the one the checkpoint was trained with (from its .state.json), unless --image-shape says.

writes `<prefix>-NNNN.onnx` (batch dimension left free), then runs a random batch through MXNet and
onnxruntime and fails unless the logits agree within --rtol (relative to the largest logit). Needs the
`onnx` extra: `pip install -e .[onnx]` (onnx 1.15: MXNet's exporter imports `onnx.mapping`, gone in 1.16).
"""
import argparse
import os
import sys

if __name__ == "__main__":  # before the imports a Python it refuses could fail on, one line
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from rn50kit.common import supported
    supported.require_supported_python("export_onnx")

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tag(epoch):
    """A checkpoint's tag: NNNN for an epoch number, or "best" (<prefix>-best.params, the best validation top-1)."""
    return "best" if str(epoch) == "best" else f"{int(epoch):04d}"


def mxnet_with_onnx():
    """MXNet, its exporter's translations bound to onnx: the kit loads MXNet without onnx (supported.import_mxnet),
    and those modules bind onnx when they load (None where it was missing), so they load again now that it is."""
    import importlib

    import mxnet as mx
    import onnx
    from mxnet.onnx.mx2onnx._op_translations import _op_translations_opset12, _op_translations_opset13
    for translations in (_op_translations_opset12, _op_translations_opset13):
        if translations.onnx is not onnx:
            importlib.reload(translations)
    return mx


def export_onnx(prefix, epoch, image_shape, onnx_file=None):
    """Write the ONNX file for a checkpoint (``epoch``: a number or "best"); the symbol must compute in float32
    (float16 files: re-export)."""
    import tempfile

    mx = mxnet_with_onnx()
    onnx_file = onnx_file or f"{prefix}-{tag(epoch)}.onnx"
    tmp = onnx_file + ".tmp"
    with tempfile.TemporaryDirectory() as scratch:
        symbol, params = f"{prefix}-symbol.json", f"{prefix}-{tag(epoch)}.params"
        plain = os.path.join(scratch, "plain-symbol.json")
        if plain_symbol(prefix, epoch, plain):
            symbol = plain
        # MXNet's exporter reads the files' prefix and epoch number from their names
        if not tag(epoch).isdigit() or symbol == plain:
            os.symlink(os.path.abspath(symbol), os.path.join(scratch, "model-symbol.json"))
            os.symlink(os.path.abspath(params), os.path.join(scratch, "model-0000.params"))
            symbol, params = os.path.join(scratch, "model-symbol.json"), os.path.join(scratch, "model-0000.params")
        mx.onnx.export_model(symbol, params,
                             in_shapes=[(1,) + tuple(image_shape)], in_types=[np.float32], onnx_file_path=tmp,
                             dynamic=True, dynamic_input_shapes=[(None,) + tuple(image_shape)])
    _drop_initializer_inputs(tmp)
    os.replace(tmp, onnx_file)
    return onnx_file


def _drop_initializer_inputs(path):
    """MXNet's exporter also lists the weights as graph inputs; without that, onnxruntime can fold constants."""
    import onnx
    model = onnx.load(path)
    weights = {init.name for init in model.graph.initializer}
    inputs = [inp for inp in model.graph.input if inp.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    onnx.save(model, path)


def compare_with_onnxruntime(prefix, epoch, onnx_file, image_shape, batch_size=2, seed=0):
    """Largest |MXNet - onnxruntime| logit difference over the largest |logit|, on one random batch."""
    import mxnet as mx
    import onnxruntime
    data = np.random.RandomState(seed).uniform(-2, 2, size=(batch_size,) + tuple(image_shape)).astype(np.float32)
    import warnings
    with warnings.catch_warnings():  # "Cannot decide type for data": the input's type is only known at run time
        warnings.simplefilter("ignore", UserWarning)
        net = mx.gluon.SymbolBlock.imports(f"{prefix}-symbol.json", ["data"], f"{prefix}-{tag(epoch)}.params",
                                           ctx=mx.cpu())
    expected = net(mx.nd.array(data)).asnumpy().astype(np.float64)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only
    session = onnxruntime.InferenceSession(onnx_file, options, providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: data})[0].astype(np.float64)
    return float(np.abs(got - expected).max() / max(np.abs(expected).max(), 1e-12))


def trained_args(prefix, epoch):
    """The arguments train.py recorded in the checkpoint's state file, with its model's name, or None (another
    kit's checkpoint)."""
    import json
    try:
        if tag(epoch) == "best":  # its state is the run's latest
            from rn50kit.weights import checkpoint
            state = checkpoint.trained_settings(f"{prefix}-best.params") or {}
        else:
            with open(f"{prefix}-{tag(epoch)}.state.json") as f:
                state = json.load(f)
        return dict({"model": state.get("model")}, **state["args"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def trained_image_shape(prefix, epoch):
    """C,H,W recorded in the checkpoint's state file by train.py, or None (another kit's checkpoint)."""
    try:
        return ",".join(str(v) for v in trained_args(prefix, epoch)["image_shape"])
    except (KeyError, TypeError):
        return None


class NotExportable(ValueError):
    """A checkpoint this tool cannot turn into ONNX, with what to do."""


FUSED_BN_RELU = "_contrib_BatchNormWithReLU"  # --fuse-bn-relu 1: oneDNN only, and MXNet's exporter has no converter


def plain_symbol(prefix, epoch, path):
    """Write to ``path`` the symbol of the checkpoint's network rebuilt with BatchNorm and ReLU apart, when its own
    holds MXNet's fused BatchNorm+ReLU; returns whether it did. The parameters are the same either way (names and
    values), so the checkpoint's .params file goes with it. NotExportable where the network cannot be rebuilt."""
    import mxnet as mx
    with open(f"{prefix}-symbol.json") as f:
        if FUSED_BN_RELU not in f.read():
            return False
    import models
    from rn50kit.config import cli
    unknown = (f"{prefix}-symbol.json holds {FUSED_BN_RELU} (trained with --fuse-bn-relu 1), which MXNet's ONNX "
               "exporter cannot convert, and")
    where = ("the run's latest whole checkpoint (<prefix>-NNNN.params, .states and .state.json)" if tag(epoch) == "best"
             else f"{prefix}-{tag(epoch)}.state.json")
    args = trained_args(prefix, epoch)
    if not args:
        raise NotExportable(f"{unknown} no train.py state names the network to rebuild without it: it is read from "
                            f"{where}, missing or unreadable here")
    try:
        recorded = argparse.Namespace(**dict(cli.config_defaults(models.ModelConfig), **args))
        model_cfg = cli.config_from(models.ModelConfig, recorded, fuse_bn_relu=0, drop_path=0.0)
        net = models.build_network(model_cfg, args["image_shape"][0], args.get("input_layout", "NCHW"), "float32")
    except (KeyError, TypeError, ValueError) as error:
        raise NotExportable(f"{unknown} its state ({where}) does not rebuild the network: {error}")
    net(mx.sym.var("data")).save(path)
    return True


def main(argv=None):
    from rn50kit.common.helptext import HelpFormatter
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument("prefix", help="checkpoint prefix: <prefix>-symbol.json and <prefix>-NNNN.params")
    parser.add_argument("epoch", help="checkpoint epoch (the NNNN), or best (<prefix>-best.params)")
    parser.add_argument("--image-shape", default=None,
                        help="C,H,W of the network input (default: the checkpoint's, else 3,224,224)")
    parser.add_argument("--output", default=None, help="ONNX file (default <prefix>-NNNN.onnx, <prefix>-best.onnx)")
    parser.add_argument("--rtol", type=float, default=1e-4, help="largest accepted relative logit difference")
    args = parser.parse_args(argv)
    if args.epoch != "best" and not args.epoch.isdigit():
        parser.error(f"epoch must be a number (the NNNN of <prefix>-NNNN.params) or best, got {args.epoch!r}")
    args.image_shape = args.image_shape or trained_image_shape(args.prefix, args.epoch) or "3,224,224"
    try:
        image_shape = tuple(int(v) for v in args.image_shape.split(","))
    except ValueError:
        parser.error(f"--image-shape must be C,H,W integers, got {args.image_shape!r}")
    for path in (f"{args.prefix}-symbol.json", f"{args.prefix}-{tag(args.epoch)}.params"):
        if not os.path.isfile(path):
            parser.error(f"no checkpoint file {path}; give the prefix and epoch that train.py saved")
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        parser.error("onnx and onnxruntime are not installed: pip install -e .[onnx]")
    try:
        onnx_file = export_onnx(args.prefix, args.epoch, image_shape, args.output)
    except NotExportable as error:
        parser.error(str(error))
    difference = compare_with_onnxruntime(args.prefix, args.epoch, onnx_file, image_shape)
    print(f"{onnx_file}: onnxruntime vs MXNet logits, relative difference {difference:.2e}")
    if difference > args.rtol:
        print(f"error: the ONNX model differs from MXNet by {difference:.2e} > --rtol {args.rtol}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
