"""The run's network: built from its ModelConfig, initialised on the run's contexts with every parameter's shape
known, and, with --pretrained, the published weights loaded into it."""
import dataclasses
import logging

import mxnet as mx

import models
from rn50kit.config.cli import UsageError
from rn50kit.config.data_flags import input_shape
from rn50kit.data import protocol
from rn50kit.weights import pretrained

TRAINING_MODES = ("train", "train_val")


def build_network(cfg, ctxs, amp_graph):
    """The network, initialised on ``ctxs`` and hybridized, every parameter's shape known. ``amp_graph``: its
    operators run in bfloat16 through MXNet's AMP."""
    if amp_graph:
        # Operators run in bfloat16 on oneDNN through MXNet's AMP (parameters stay float32). AMP patches
        # MXNet's operators, so it must come before the network is built.
        from mxnet.contrib import amp
        amp.init(target_dtype="bfloat16")
    try:
        # Scoring builds the inference graph: no stochastic depth in it at all (training's Dropout passes through)
        model_cfg = cfg.model if cfg.fit.mode in TRAINING_MODES else dataclasses.replace(cfg.model, drop_path=0.0)
        net = models.build_network(model_cfg, cfg.data.image_shape[0], cfg.data.input_layout, cfg.fit.dtype)
    except ValueError as error:  # flags that do not fit together
        raise UsageError(str(error))
    net.initialize(mx.init.Xavier(), ctx=ctxs)  # layers with their own initializer keep it
    net.hybridize(static_alloc=True, static_shape=True)
    shape = input_shape(cfg.data.image_shape, cfg.data.input_layout, 1)
    # Finish deferred shapes (so checkpoints load into every parameter) by shape inference, not a forward
    # pass: an inference-mode forward lets oneDNN reorder the weights into its own layout, which Horovod's
    # broadcast and allreduce cannot read on CPU.
    net.infer_shape(mx.nd.zeros(shape, ctx=ctxs[0], dtype=protocol.out_dtype(cfg.fit.dtype)))
    for param in net.collect_params().values():
        param._finish_deferred_init()
    return net


def start_from_pretrained(cfg, info, net, ctxs, dist):
    """--pretrained: the published weights into ``net`` on every rank (a file that does not fit fails alike
    everywhere; rank 0's new classifier reaches the others through fit's broadcast). A resumed run then loads its
    checkpoint over them. Returns the RunInfo with what was loaded, for the report."""
    loaded = pretrained.load_pretrained(net, cfg.finetune.pretrained, ctxs, cfg.model.num_classes, cfg.model.name)
    if dist.is_primary:
        logging.info("%s", loaded.summary())
    return dataclasses.replace(info, report_info={**info.report_info, "pretrained": dataclasses.asdict(loaded)})
