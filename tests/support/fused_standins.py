"""Stand-ins for NVIDIA's fused BatchNorm ops, registered in the test process only (pytest's monkeypatch): NVIDIA's
MXNet builds register `BatchNormAddRelu` and give BatchNorm an `act_type` argument; upstream MXNet (this machine's)
has neither. The stand-ins compute what those ops compute from upstream's own ops, so a network built on them must
give the plain network's numbers; ``wrong=True`` leaves the ReLU out, for a comparison that must fail."""
import mxnet as mx

from rn50kit.hardware import devices


def _module(x):
    return mx.sym if isinstance(x, mx.sym.Symbol) else mx.nd


def register(monkeypatch, bn_relu=True, bn_add_relu=True, wrong=False):
    """Register the stand-ins where MXNet's operator registry and op modules are read; returns the calls made
    ({op: count}), so a test sees the network ran them."""
    calls = {"BatchNormAddRelu": 0, "BatchNorm act_type": 0}
    activate = (lambda F, x: x) if wrong else (lambda F, x: F.Activation(x, act_type="relu"))
    if bn_add_relu:
        def batchnorm_add_relu(data, addend, gamma, beta, moving_mean, moving_var, name=None, **kwargs):
            calls["BatchNormAddRelu"] += 1
            F = _module(data)
            return activate(F, F.BatchNorm(data, gamma, beta, moving_mean, moving_var, **kwargs) + addend)
        for module in (mx.nd, mx.sym):
            monkeypatch.setattr(module, "BatchNormAddRelu", batchnorm_add_relu, raising=False)
        registered = devices.registered_operators() | {"BatchNormAddRelu"}
        monkeypatch.setattr(devices, "registered_operators", lambda: registered)
    if bn_relu:
        for module in (mx.nd, mx.sym):
            upstream = module.BatchNorm

            def batchnorm(*args, act_type=None, upstream=upstream, **kwargs):
                if act_type is None:
                    return upstream(*args, **kwargs)
                assert act_type == "relu"
                calls["BatchNorm act_type"] += 1
                out = upstream(*args, **kwargs)
                return activate(_module(out), out)
            monkeypatch.setattr(module, "BatchNorm", batchnorm)
        arguments = devices.operator_arguments

        def with_act_type(name):
            return arguments(name) + (["act_type"] if name == "BatchNorm" else [])
        monkeypatch.setattr(devices, "operator_arguments", with_act_type)
    return calls
