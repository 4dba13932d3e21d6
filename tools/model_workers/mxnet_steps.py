"""Our worker's steps (MXNet 1.9.1, oneDNN): float32 and bfloat16 (AMP) training steps, the inference graphs
scoring uses, INT8 inference, and the matrix products of each precision's ceiling."""
import json

from model_workers.timing import CEILING_SIZE, bfloat16_missing, matmul_rate

SEED = 1  # every MXNet worker draws the same weights and data: their logits can be compared


def mxnet_bfloat16():
    """MXNet 1.x's bfloat16 dtype, np.dtype([("bfloat16", np.uint16)]): NumPy has none, so MXNet's operators take
    this one (``dtype="bfloat16"`` fails in NumPy: "data type 'bfloat16' not understood")."""
    from mxnet.contrib.amp.amp import bfloat16
    return bfloat16


def dtype_name(dtype):
    """'float32', 'int8', 'bfloat16' (MXNet's bfloat16 is a NumPy record dtype: its one field names it)."""
    import numpy as np
    dtype = np.dtype(dtype)
    return dtype.names[0] if dtype.names else dtype.name


def mxnet_matrix_products(mx, dtype, size=CEILING_SIZE):
    """The large matrix product of this worker's precision through oneDNN (FullyConnected), its operands made
    (cast or quantized) but nothing multiplied yet: {precision: product}, ``product()`` returning the output (in
    the operands' precision; int32 for int8), ``product.operands`` the two inputs."""
    a = mx.nd.random.uniform(-1, 1, shape=(size, size))
    w = mx.nd.random.uniform(-1, 1, shape=(size, size))

    def fc(x, weight):
        def product():
            return mx.nd.FullyConnected(x, weight, num_hidden=size, no_bias=True)
        product.operands = (x, weight)
        return product
    if dtype == "bfloat16":
        bfloat16 = mxnet_bfloat16()
        return {"bfloat16": fc(mx.nd.amp_cast(a, dtype=bfloat16), mx.nd.amp_cast(w, dtype=bfloat16))}
    if dtype == "float32":
        return {"float32": fc(a, w)}
    qa, amin, amax = mx.nd.contrib.quantize_v2(a + 1, out_type="uint8")
    qw, wmin, wmax = mx.nd.contrib.quantize_v2(w, out_type="int8")

    def int8():
        return mx.nd.contrib.quantized_fully_connected(qa, qw, None, amin, amax, wmin, wmax, None, None,
                                                       num_hidden=size, no_bias=True)[0]
    int8.operands = (qa, qw)
    return {"int8": int8}


def mxnet_ceilings(products, size=CEILING_SIZE):
    """{precision: a function measuring the GFLOP/s (GOP/s) of that one of ``mxnet_matrix_products``}."""
    return {precision: lambda product=product: matmul_rate(lambda: product().wait_to_read(), size)
            for precision, product in products.items()}


def graph_summary(mx, net, shape):
    """What the hybridized ``net`` computes in, read from its symbol (nothing runs): its convolutions, how many
    of them take bfloat16 input (the AMP pass's amp_cast in front), and the logits' dtype and shape."""
    symbol = net(mx.sym.var("data"))
    nodes = json.loads(symbol.tojson(remove_amp_cast=False))["nodes"]  # tojson() drops the AMP casts by default
    convolutions = [node for node in nodes if node["op"] == "Convolution"]
    in_bfloat16 = [node for node in convolutions if nodes[node["inputs"][0][0]]["op"] == "amp_cast"
                   and nodes[node["inputs"][0][0]]["attrs"].get("dtype") == "bfloat16"]
    _, (logits_type,), _ = symbol.infer_type(data="float32")
    _, (logits_shape,), _ = symbol.infer_shape(data=shape)
    return {"convolutions": len(convolutions), "bfloat16 convolutions": len(in_bfloat16),
            "logits": [dtype_name(logits_type), list(logits_shape)]}


def mxnet_training(mx, net, data, label):
    """A training step as train.py runs it: in a bfloat16 worker the AMP pass is in the graph, and there is no loss
    scaling (bfloat16 keeps float32's exponent range; fit.py scales float16 only)."""
    from mxnet import autograd, gluon

    from rn50kit.training import optimizers
    trainer = gluon.Trainer(net.collect_params(), optimizers.SGD(learning_rate=0.01, momentum=0.9, wd=1e-5))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def step():
        with autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(data.shape[0])
        mx.nd.waitall()
    return step


def fresh_network(mx, model, dtype, fuse_bn_relu=False):
    """Our ``model`` as train.py builds it (bfloat16: float32 parameters for AMP, float32 logits), initialised and
    hybridized."""
    import models
    net = models.get_model(model, dtype=dtype, fuse_bn_relu=fuse_bn_relu)
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    return net


def synthetic_batch(mx, batch_size, image_size):
    """(images, labels): the same for every MXNet worker, whose random seed is SEED."""
    data = mx.nd.random.uniform(-1, 1, shape=(batch_size, 3, image_size, image_size))
    return data, mx.nd.array([i % 1000 for i in range(batch_size)])


def mxnet_steps(kind, model, batch_size, image_size, fuse_bn_relu=False):
    """(steps to time, ceiling meters (mxnet_ceilings), why nothing is timed or None, what was built, the first
    image's logits by dtype).

    A bfloat16 worker builds everything on any CPU: AMP (amp.init), the networks and their AMP graphs
    (graph_summary), the matrix product's operands cast to bfloat16. Only what runs oneDNN's bfloat16 kernels (a
    forward pass, a training step, the matrix product) waits for a CPU that has them."""
    bfloat16 = kind == "mxnet-bfloat16"
    if bfloat16:
        from mxnet.contrib import amp
        amp.init(target_dtype="bfloat16")  # before the networks are built: AMP patches MXNet's operators
    import mxnet as mx

    import models
    from rn50kit.graph import inference
    from rn50kit.scoring import quantize
    mx.random.seed(SEED)
    data, label = synthetic_batch(mx, batch_size, image_size)
    shape = data.shape
    precision = {"mxnet-float32": "float32", "mxnet-int8": "int8", "mxnet-bfloat16": "bfloat16"}[kind]
    network_dtype = "bfloat16" if bfloat16 else "float32"
    steps = {}
    if kind != "mxnet-int8":
        steps[f"ours {precision} training step"] = mxnet_training(
            mx, fresh_network(mx, model, network_dtype, fuse_bn_relu), data, label)
    inference_net = fresh_network(mx, model, network_dtype)
    built = {} if kind == "mxnet-int8" else graph_summary(mx, inference_net, shape)
    products = mxnet_matrix_products(mx, precision)
    built["operands"] = [dtype_name(x.dtype) for x in products[precision].operands]
    missing = bfloat16_missing() if bfloat16 else None
    if missing:  # all built and cast; what is left runs oneDNN's bfloat16 kernels, which this CPU lacks
        return {}, {}, missing, built, None
    logits = {"float32": inference_net(data)[0].asnumpy().astype(float).tolist()}
    if kind == "mxnet-int8":  # a worker of its own: the fusion switch it needs is process-wide
        calibration = quantize.describe_calibration("naive", 1, batch_size, "synthetic")
        int8 = quantize.quantize(inference_net, shape, calibration,
                                 lambda: mx.io.NDArrayIter(data, batch_size=batch_size))
        steps["ours int8 inference"] = lambda: int8(data).wait_to_read()
        logits = None  # the float32 network's: nothing to compare
    elif bfloat16:  # training only: scoring's bfloat16 graph is built without AMP's patching (below)
        logits = None
    else:
        fused = inference.optimize_for_inference(inference_net, shape)
        steps["ours float32 inference"] = lambda: fused(data).wait_to_read()
        if not bfloat16_missing():
            # The graph bfloat16 scoring uses (inference.to_bfloat16), built as train.py builds it: in a process
            # without amp.init, whose patching would wrap oneDNN's fused convolutions in float32 casts.
            network = models.get_model(model, dtype="bfloat16")
            network.initialize()
            for name, param in network.collect_params().items():  # the float32 network's weights
                param.set_data(inference_net.collect_params()[name].data())
            low = inference.to_bfloat16(network, shape)
            steps["ours bfloat16 inference"] = lambda: low(data).wait_to_read()
            logits["bfloat16"] = low(data)[0].asnumpy().astype(float).tolist()
    return steps, mxnet_ceilings(products), None, built, logits
