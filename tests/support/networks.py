"""models.py's flags and small networks with random values in every parameter (BatchNorm statistics too), and
whether this CPU computes in bfloat16 (unit/test_models, test_precision, test_memory, e2e/test_models_cli,
test_reduced_precision)."""
import argparse

import mxnet as mx
import numpy as np

import models
from rn50kit.config import settings

NO_BFLOAT16 = settings.bfloat16_unsupported()  # None where this CPU has oneDNN's bfloat16 kernels


def parse_model_args(argv):
    parser = argparse.ArgumentParser()
    models.add_model_args(parser)
    return parser.parse_args(argv)


def randomise(net, seed=0):
    """Random values for every parameter, BatchNorm statistics included (gamma zero-init would hide bugs)."""
    rng = np.random.RandomState(seed)
    for name, param in sorted(net.collect_params().items()):
        shape = param.shape
        if name.endswith("running_var"):
            value = rng.uniform(0.5, 2.0, shape)
        elif name.endswith("gamma"):
            value = rng.uniform(0.5, 1.5, shape)
        elif name.endswith(("beta", "running_mean", "bias")):
            value = rng.uniform(-0.2, 0.2, shape)
        else:
            value = rng.normal(0, np.sqrt(2.0 / np.prod(shape[1:])), shape)
        param.set_data(mx.nd.array(value, dtype=param.dtype))


def small_net(name="resnet18_v1.5", seed=0, **kwargs):
    net = models.get_model(name, num_classes=10, **kwargs)
    net.initialize()
    randomise(net, seed)
    return net


def built(num_layers, image, dtype="float32"):
    """A hybridized ResNet of ``num_layers`` (1000 classes), Xavier-initialised, its shapes inferred for
    ``image``-pixel inputs."""
    net = models.build_network(models.ModelConfig(num_layers=num_layers), 3, "NCHW", dtype)
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net.hybridize()
    net.infer_shape(mx.nd.zeros((1, 3, image, image), dtype="float16" if dtype == "float16" else "float32"))
    return net
