"""models.py: architectures against published parameter counts and a numpy forward, precisions, fused ops,
stochastic depth (its files and graphs: test_graph.py)."""
import math

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd
from mxnet.gluon import nn

import models
from rn50kit.common import rules
from rn50kit.graph.parameters import load_parameters
from rn50kit.graph.symbol_files import export
from support.networks import parse_model_args, randomise, small_net


def test_drop_path_keeps_the_expected_value_in_training_and_is_identity_at_inference():
    """Added with the RSB-style recipes' pieces (CutMix, BCE, LAMB, stochastic depth)."""
    p, n = 0.5, 4000
    block = models.BatchNormAddReLU(drop_path=p, in_channels=2, gamma_initializer="zeros", beta_initializer="ones")
    block.initialize()
    block.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.random.normal(shape=(n, 2, 3, 3))
    addend = mx.nd.zeros((n, 2, 3, 3))
    with autograd.record(train_mode=True):  # bn(x) = beta = 1 everywhere: the branch is 1 or dropped
        out = block(x, addend).asnumpy()
    per_sample = out.reshape(n, -1)
    assert set(np.unique(per_sample)) <= {0.0, 1 / (1 - p)}
    assert (per_sample.min(axis=1) == per_sample.max(axis=1)).all()  # the whole branch of a sample, or none
    kept = (per_sample[:, 0] > 0).mean()
    assert abs(kept - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    assert abs(per_sample.mean() - 1) < 5 * math.sqrt(p / (1 - p) / n)
    np.testing.assert_array_equal(block(x, addend).asnumpy(), np.ones((n, 2, 3, 3)))  # inference: identity


# Published trainable parameter counts for 1000 classes (torchvision / the ResNeXt paper's reference models).
PUBLISHED = {"resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032, "resnet101": 44_549_160,
             "resnet152": 60_192_808, "resnext101_32x4d": 44_177_704}


@pytest.mark.parametrize("name", [f"resnet{d}_v{v}" for d in (18, 34, 50, 101, 152) for v in ("1", "1.5")]
                         + ["resnext101_32x4d", "resnext101_32x4d_v1"])
def test_trainable_parameters_equal_published(name):
    net = models.get_model(name)  # every layer knows its input channels: shapes known without initialising
    assert models.trainable_parameters(net) == PUBLISHED[name.split("_v")[0]]


def np_conv(x, w, stride, groups=1):
    """Plain numpy 2-D convolution (NCHW, OIHW weights, 'same' padding k//2)."""
    k = w.shape[2]
    pad = k // 2
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, _, h, wd = x.shape
    ho, wo = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
    cin_g, cout_g = x.shape[1] // groups, w.shape[0] // groups
    out = np.zeros((n, w.shape[0], ho, wo))
    for g in range(groups):
        xs = xp[:, g * cin_g:(g + 1) * cin_g]
        ws = w[g * cout_g:(g + 1) * cout_g]
        for i in range(k):
            for j in range(k):
                patch = xs[:, :, i:i + stride * ho:stride, j:j + stride * wo:stride]
                out[:, g * cout_g:(g + 1) * cout_g] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out


def np_bn(x, p, prefix, training, eps=1e-5):
    gamma, beta = p[prefix + "gamma"], p[prefix + "beta"]
    if training:
        mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    else:
        mean, var = p[prefix + "running_mean"], p[prefix + "running_var"]
    shape = (1, -1, 1, 1)
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * gamma.reshape(shape) + beta.reshape(shape)


def np_bottleneck(x, p, version, stride, groups, training):
    relu = lambda v: np.maximum(v, 0)  # noqa: E731
    s1, s3 = (stride, 1) if version == "1" else (1, stride)
    y = relu(np_bn(np_conv(x, p["conv1_weight"], s1), p, "bn1_", training))
    y = relu(np_bn(np_conv(y, p["conv2_weight"], s3, groups), p, "bn2_", training))
    y = np_bn(np_conv(y, p["conv3_weight"], 1), p, "bn3_", training)
    shortcut = np_bn(np_conv(x, p["conv1sc_weight"], stride), p, "bnsc_", training)
    return relu(y + shortcut)


@pytest.mark.parametrize("version", ["1", "1.5"])
@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("training", [False, True])
def test_bottleneck_matches_numpy(version, groups, training):
    block = models.Bottleneck(models.Builder(), channels=32, stride=2, in_channels=16, version=version,
                              groups=groups, width=16 if groups > 1 else None, prefix="b_")
    block.initialize()
    randomise(block, seed=3)
    x = np.random.RandomState(1).normal(size=(2, 16, 9, 9))
    with autograd.record(train_mode=training):
        got = block(mx.nd.array(x)).asnumpy()
    params = {k[len("b_"):]: v.data().asnumpy().astype(np.float64) for k, v in block.collect_params().items()}
    expected = np_bottleneck(x, params, version, 2, groups, training)
    assert got.shape == (2, 32, 5, 5)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_fused_bn_relu_gives_the_same_numbers():
    if not models.fused_bn_relu_available():
        pytest.skip("this MXNet has no fused BatchNorm+ReLU")
    plain, fused = small_net(), small_net(fuse_bn_relu=True)
    assert any(isinstance(b, mx.gluon.nn.BatchNormReLU) for b in fused.features)
    assert list(plain.collect_params().keys()) == list(fused.collect_params().keys())
    x = mx.nd.random.uniform(shape=(2, 3, 32, 32))
    for training in (False, True):
        with autograd.record(train_mode=training):
            np.testing.assert_allclose(plain(x).asnumpy(), fused(x).asnumpy(), rtol=1e-5, atol=1e-5)


def blocks_of(net, kind):
    found = []

    def visit(block):
        found.extend([block] if isinstance(block, kind) else [])
        for child in block._children.values():
            visit(child)
    visit(net)
    return found


def test_nvidias_fused_ops_are_read_from_mxnets_operator_registry(monkeypatch):
    """Upstream MXNet 1.9.1 (this machine's) has neither of NVIDIA's ops; a build that registers them is seen."""
    from rn50kit.hardware import devices
    from support import fused_standins
    assert not devices.nvidia_bn_relu() and not devices.nvidia_bn_add_relu() and not devices.nvidia_fused_batchnorm()
    assert not models.fused_bn_add_relu_available()
    fused_standins.register(monkeypatch)
    assert devices.nvidia_bn_relu() and devices.nvidia_bn_add_relu() and devices.nvidia_fused_batchnorm()
    assert models.fused_bn_add_relu_available()


def test_upstream_mxnet_builds_the_plain_add_relu_whatever_is_asked():
    fused = models.get_model("resnet18_v1.5", fuse_bn_relu=True, fuse_bn_add_relu=True)
    assert not any(block.fused for block in blocks_of(fused, models.BatchNormAddReLU))
    assert not blocks_of(fused, models.BatchNormActReLU)  # upstream's BatchNormReLU (oneDNN) instead
    with pytest.raises(ValueError, match="--fuse-bn-relu 1 needs --conv-layout NCHW"):
        models.model_kwargs(models.ModelConfig(fuse_bn_relu=1, conv_layout="NHWC"))


def tiny_resnet(seed, fuse=False):
    """A stem, a basic block and a downsampling bottleneck of the kit's blocks, 8-16 channels: each fused op."""
    builder = models.Builder(fuse_bn_relu=fuse, fuse_bn_add_relu=fuse)
    net = nn.HybridSequential(prefix="")
    with net.name_scope():
        net.add(builder.conv(8, 3, 1, 3, prefix="conv0_"), *builder.batchnorm_relu(8, "bn0_"),
                models.BasicBlock(builder, 8, 1, 8, prefix="stage1_unit1_"),
                models.Bottleneck(builder, 16, 2, 8, prefix="stage2_unit1_"), nn.Flatten())
    net.initialize()
    randomise(net, seed)
    return net


def test_nvidias_fused_ops_build_the_fused_blocks_with_the_same_parameter_names(monkeypatch):
    from support import fused_standins
    fused_standins.register(monkeypatch)
    plain = models.get_model("resnet50_v1.5")
    fused = models.get_model("resnet50_v1.5", fuse_bn_relu=True, fuse_bn_add_relu=True)
    assert len(blocks_of(fused, models.BatchNormActReLU)) == 33  # the stem's and two per bottleneck (16)
    assert not blocks_of(fused, nn.Activation) and len(blocks_of(plain, nn.Activation)) == 33
    add_relus = blocks_of(fused, models.BatchNormAddReLU)
    assert len(add_relus) == 16 and all(block.fused for block in add_relus)
    assert not any(block.fused for block in blocks_of(plain, models.BatchNormAddReLU))
    assert list(plain.collect_params().keys()) == list(fused.collect_params().keys())
    # NVIDIA's BatchNorm fuses in any axis: --fuse-bn-relu 1 with NHWC is not refused there
    assert models.model_kwargs(models.ModelConfig(fuse_bn_relu=1, conv_layout="NHWC"))["fuse_bn_relu"]


@pytest.mark.parametrize("ops", ["nvidia", "upstream"])
@pytest.mark.parametrize("hybridize", [False, True])
def test_fused_ops_give_the_plain_numbers_and_checkpoints(monkeypatch, tmp_path, hybridize, ops):
    """With NVIDIA's ops (stand-ins here) or upstream's nn.BatchNormReLU (oneDNN, this machine's): logits and
    gradients as the plain network's, and the kit's checkpoint of either loads into the other."""
    from support import fused_standins
    calls = fused_standins.register(monkeypatch) if ops == "nvidia" else None
    plain, fused = tiny_resnet(0), tiny_resnet(0, fuse=True)
    kind = models.BatchNormActReLU if ops == "nvidia" else nn.BatchNormReLU
    assert len(blocks_of(fused, kind)) == 4 and not blocks_of(fused, nn.Activation)
    x = mx.nd.random.uniform(-1, 1, shape=(4, 3, 8, 8))
    results = []
    for net in (plain, fused):
        if hybridize:
            net.hybridize(static_alloc=True, static_shape=True)
        with autograd.record():
            out = net(x)
        out.backward(mx.nd.array(np.random.RandomState(1).normal(size=out.shape)))
        results.append((out.asnumpy(), {k: p.grad().asnumpy() for k, p in net.collect_params().items()
                                        if p.grad_req != "null"}))
    assert calls is None or (calls["BatchNormAddRelu"] > 0 and calls["BatchNorm act_type"] > 0)
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-5, atol=1e-5)
    for name, grad in results[0][1].items():
        np.testing.assert_allclose(results[1][1][name], grad, rtol=1e-4, atol=1e-5, err_msg=name)
    for source, target in ((fused, tiny_resnet(1)), (plain, tiny_resnet(2, fuse=True))):
        source.hybridize()
        source(x)
        _, params = export(source, str(tmp_path / f"net{id(source)}"), epoch=1)
        load_parameters(target, params, mx.cpu())
        np.testing.assert_allclose(target(x).asnumpy(), source(x).asnumpy(), rtol=1e-5, atol=1e-5)


def test_float16_model_from_args_and_numerics():
    args = parse_model_args(["--num-layers", "18", "--num-classes", "10"])
    args.dtype = "float16"
    net = models.get_model_from_args(args)
    net.initialize()
    dtypes = {k: np.dtype(p.dtype) for k, p in net.collect_params().items()}
    assert all(d == np.float32 for k, d in dtypes.items() if "_bn" in k or k.startswith("bn"))
    assert dtypes["conv0_weight"] == np.float16 and dtypes["fc1_weight"] == np.float16
    _, out_types, _ = net(mx.sym.var("data")).infer_type(data=np.float16)
    assert out_types == [np.float32]  # logits come back as float32
    ctx = mx.gpu(0) if mx.context.num_gpus() else mx.cpu()
    try:
        probe = mx.nd.Convolution(mx.nd.ones((1, 1, 3, 3), ctx=ctx, dtype="float16"),
                                  mx.nd.ones((1, 1, 1, 1), ctx=ctx, dtype="float16"),
                                  kernel=(1, 1), num_filter=1, no_bias=True)
        probe.wait_to_read()
    except mx.MXNetError as error:
        # MXNet's CPU build has no float16 convolution: what it says, and why runner and train.py refuse
        # --dtype float16 without a GPU (the numbers are checked on GPUs by tools/gpu_check.py).
        assert ctx.device_type == "cpu" and "FP16 gemm on cpu not implemented" in str(error)
        assert rules.dtype_problem("float16", "train_val", gpu=False).startswith("--dtype float16 needs a GPU")
        return
    ref = small_net()
    half = models.get_model("resnet18_v1.5", num_classes=10, dtype="float16")
    half.initialize(ctx=ctx)
    for name, param in ref.collect_params().items():
        half.collect_params()[name].set_data(param.data().astype(half.collect_params()[name].dtype))
    x = mx.nd.random.uniform(shape=(2, 3, 32, 32))
    expected = ref(x).asnumpy()
    got = half(x.as_in_context(ctx).astype("float16"))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got.asnumpy(), expected, atol=0.01 * np.abs(expected).max(), rtol=0.01)
