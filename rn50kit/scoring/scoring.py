"""Scoring: top-1/top-5 over a validation set (exact over devices and ranks), the graph a checkpoint is scored
with (as trained, oneDNN's fused float32 or bfloat16, or calibrated INT8), --mode val's passes and --mode pred's
top classes. Facts about what was scored come back as values (Scorable), not as attributes on the network."""
import dataclasses
import logging
import os
import time

import mxnet as mx
import numpy as np
from mxnet import gluon

from rn50kit.common import backends
from rn50kit.config.data_flags import input_shape
from rn50kit.data.protocol import out_dtype
from rn50kit.graph.inference import optimize_for_inference, to_bfloat16
from rn50kit.reporting.report import Report
from rn50kit.scoring import predict, predict_many, quantize
from rn50kit.weights import checkpoint
from rn50kit.weights.checkpoint import workspace_path

log = logging.getLogger("rn50")


class ScoringError(Exception):
    """Nothing to score, or no data to score it on: reported as one line."""


def topk_hits(logits, label, valid):
    """(top-1 hits, top-5 hits) over the first ``valid`` rows."""
    return tuple(count.asscalar() for count in topk_counts(logits, label, valid))


def topk_counts(logits, label, valid):
    """(top-1 hits, top-5 hits) over the first ``valid`` rows, as NDArrays not yet read from the device."""
    if valid == 0:  # all padding: a device whose validation shard has ended
        zero = mx.nd.zeros((1,), ctx=logits.context)
        return zero, zero
    logits, label = logits[:valid], label[:valid]
    top5 = mx.nd.topk(logits, k=min(5, logits.shape[1]), ret_typ="indices")
    hits = top5 == label.reshape((-1, 1)).astype(top5.dtype)
    return hits[:, 0].sum(), hits.sum()


def valid_counts(batch, sizes):
    """Samples that are not padding in each part of ``batch`` (parts of ``sizes``): a batch of per-device parts
    has one ``pads`` entry per part; a single batch split over devices has its padding at the end."""
    pads = getattr(batch, "pads", None)
    if pads is not None:
        return [size - pad for size, pad in zip(sizes, pads)]
    counts, remaining = [], sum(sizes) - batch.pad
    for size in sizes:
        counts.append(max(0, min(size, remaining)))
        remaining -= size
    return counts


def split(batch, ctxs, dtype):
    """Slices of the batch, one per device, in the model's input dtype."""
    if len(batch.data) == len(ctxs) > 1:  # already one part per device (one pipeline per device)
        return ([d.astype(out_dtype(dtype), copy=False).as_in_context(c) for d, c in zip(batch.data, ctxs)],
                [label.as_in_context(c) for label, c in zip(batch.label, ctxs)])
    data, label = batch.data[0], batch.label[0]
    if data.dtype != np.dtype(out_dtype(dtype)):
        data = data.astype(out_dtype(dtype))
    if len(ctxs) == 1:
        return [data.as_in_context(ctxs[0])], [label.as_in_context(ctxs[0])]
    return (gluon.utils.split_and_load(data, ctxs, even_split=False),
            gluon.utils.split_and_load(label, ctxs, even_split=False))


def validation_batches(val_iter, max_iters=None):
    """(batch, first pass?) pairs: one pass over the validation set, or with ``max_iters`` exactly that many
    batches, the set cycled when it is shorter (benchmarks time as many batches on every backend). No batch is
    drawn past ``max_iters``: the readers stay where the timed ones ended."""
    served, first_pass = 0, True
    while max_iters is None or served < max_iters:
        batches = 0
        for batch in val_iter:
            yield batch, first_pass
            served, batches = served + 1, batches + 1
            if max_iters is not None and served >= max_iters:
                return
        if max_iters is None or batches == 0:
            return
        first_pass = False


def confusion_matrix(pairs, num_classes, dist):
    """The confusion matrix (rows: true class, columns: predicted class; counts) of ``pairs`` [(predicted classes,
    labels)] (NDArrays, read here), summed over all ranks: exact, each sample counted once. Labels outside
    0..num_classes-1 are left out."""
    counts = np.zeros(num_classes * num_classes, dtype="float64")
    if pairs:
        predicted = np.concatenate([p.asnumpy().ravel() for p, _ in pairs]).astype("int64")
        labels = np.concatenate([label.asnumpy().ravel() for _, label in pairs]).astype("int64")
        keep = (labels >= 0) & (labels < num_classes)
        counts += np.bincount(labels[keep] * num_classes + predicted[keep], minlength=num_classes * num_classes)
    summed = dist.sum(counts, "val.confusion")
    return np.rint(np.asarray(summed)).astype("int64").reshape(num_classes, num_classes)


def evaluate(net, val_iter, ctxs, dist, dtype="float32", no_metrics=False, max_iters=None):
    """Top-1, top-5 and loss over the whole validation set, each sample counted once over all ranks (with
    ``max_iters``, that many batches are timed, the set cycled; the accuracy counts its first pass), and the
    confusion matrix of that pass (``confusion``, None with ``no_metrics``)."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    correct1 = correct5 = loss_sum = count = 0.0
    pairs, num_classes = [], None  # (predicted class, label) of the first pass, read from the devices at the end
    durations = []
    tic = time.time()
    for batch, first_pass in validation_batches(val_iter, max_iters):
        datas, labels = split(batch, ctxs, dtype)
        valids = valid_counts(batch, [d.shape[0] for d in datas])
        # Every device's forward and counts are queued before anything is read, so the devices run together.
        outputs = [net(data).astype("float32") for data in datas]
        if no_metrics:
            for logits in outputs:
                logits.wait_to_read()
        else:  # computed on every pass, so each timed batch does the same work
            pending = [(topk_counts(logits, label, valid),
                        loss_fn(logits[:valid], label[:valid]).sum() if valid else None, logits, label, valid)
                       for logits, label, valid in zip(outputs, labels, valids)]
            for (c1, c5), batch_loss, logits, label, valid in pending:
                c1, c5 = c1.asscalar(), c5.asscalar()
                batch_loss = batch_loss.asscalar() if batch_loss is not None else 0.0
                if first_pass:
                    correct1, correct5, loss_sum = correct1 + c1, correct5 + c5, loss_sum + batch_loss
                    num_classes = logits.shape[1]
                    if valid:  # copies: a copying data pipeline reuses its label buffers for the next batches
                        pairs.append((logits[:valid].argmax(axis=1), label[:valid].copy()))
        count += sum(valids) if first_pass else 0
        now = time.time()
        durations.append(now - tic)
        tic = now
    correct1, correct5, loss_sum, count = dist.sum([correct1, correct5, loss_sum, count], "val.counts")
    total = max(count, 1)
    confusion = None
    if not no_metrics:  # every rank takes part: one that saw no batch learns the number of classes here
        num_classes = int(max(row[0] for row in dist.gather([num_classes or 0], "val.classes")))
        confusion = confusion_matrix(pairs, num_classes, dist) if num_classes else None
    return {"top1": correct1 / total, "top5": correct5 / total, "loss": loss_sum / total,
            "durations": durations, "samples": int(count), "correct1": correct1, "correct5": correct5,
            "confusion": confusion}


class FlipTTA:
    """--val-tta flip: a network whose output for a batch is the log of the mean of the batch's and its mirror
    images' softmax, so whatever reads logits (top-k, argmax, cross-entropy, softmax) reads the averaged
    probabilities. Each image is scored with its own mirror: exact over devices and ranks as the plain scoring."""

    def __init__(self, net, input_layout="NCHW"):
        self.net = net
        self.width_axis = 3 if input_layout == "NCHW" else 2

    def __call__(self, batch):
        probs = self.net(batch).astype("float32").softmax() + \
            self.net(mx.nd.flip(batch, axis=self.width_axis)).astype("float32").softmax()
        # a probability that underflowed to 0 stays finite: log(0) would make the loss NaN
        return mx.nd.log(mx.nd.maximum(probs / 2, float(np.finfo(np.float32).tiny)))


def with_tta(net, tta, input_layout=None):
    """``net`` as --val-tta says ("none" or "flip") for batches in ``input_layout`` (default: the network's)."""
    if tta == "flip":
        return FlipTTA(net, input_layout or getattr(net, "input_layout", "NCHW"))
    return net


@dataclasses.dataclass
class Scorable:
    """A network ready to score: ``weights`` is the file its parameters came from (None: freshly initialised),
    ``info`` how its graph was made (an INT8 graph's calibration), for the report."""
    net: object
    weights: str = None
    info: dict = dataclasses.field(default_factory=dict)


def no_checkpoint_problem(fit_cfg, data_backend):
    """Why scoring without a checkpoint is refused (see load_weights), or None; asked before anything is logged."""
    if checkpoint.to_score(fit_cfg.load, fit_cfg.workspace, fit_cfg.model_prefix) is not None:
        return None
    if fit_cfg.mode == "val" and (not backends.reads_records(data_backend) or fit_cfg.no_metrics):
        return None
    return (f"no checkpoint to score: give --load PATH.params or train first (nothing matches "
            f"{workspace_path(fit_cfg.workspace, fit_cfg.model_prefix)}-NNNN.params); "
            "to time fresh weights, add --no-metrics")


def load_weights(net, fit_cfg, data_backend, ctxs, dist):
    """Load --load, else the latest checkpoint in --workspace, into ``net``; returns the path loaded, or None
    for fresh weights.

    --mode val scores freshly initialised weights when there is no checkpoint only where no accuracy is
    reported from them: on synthetic data, or with --no-metrics (a speed benchmark: the time a batch takes does
    not depend on the weights; the original kit benchmarked inference so). Elsewhere that is an error.
    """
    path = checkpoint.to_score(fit_cfg.load, fit_cfg.workspace, fit_cfg.model_prefix,
                               log.warning if dist.is_primary else None)
    if path is None:
        problem = no_checkpoint_problem(fit_cfg, data_backend)
        if problem:
            raise ScoringError(problem)
        if dist.is_primary:
            log.info("No checkpoint found: scoring freshly initialised weights (a speed benchmark)")
        return None
    if not os.path.isfile(path):
        raise ScoringError(f"--load {path} does not exist")
    # a damaged file was refused in one line by configure.complete, before its settings were taken
    checkpoint.load_params(net, path, ctxs)  # on every device the network was initialised on
    if dist.is_primary:
        log.info("Loaded %s", path)
    return path


def int8_graph(cfg, net, ctxs, dist, calibration_batches):
    """--dtype int8: the float32 checkpoint (loaded here) as oneDNN's calibrated INT8 graph (quantize.py).
    ``cfg``: the RunConfig; ``calibration_batches()``: an iterator of training batches, asked for only when the
    graph is not cached beside the checkpoint."""
    path = load_weights(net, cfg.fit, cfg.data.data_backend, ctxs, dist)
    batch = cfg.fit.batch_size // dist.size
    shape = input_shape(cfg.data.image_shape, cfg.data.input_layout, batch)
    source = quantize.calibration_source(cfg.data.data_backend, cfg.data.data_train)
    calibration = quantize.describe_calibration(cfg.quantize.calib_mode, cfg.quantize.calib_batches, batch, source)
    qnet, calibration = quantize.int8_net(net, path, shape, calibration, calibration_batches, dist.is_primary,
                                          barrier=lambda: dist.sum([0.0], "int8.saved"))
    calibration["cpu_vnni"] = quantize.vnni()  # without VNNI oneDNN's INT8 kernels are about half as fast
    if dist.is_primary:
        log.info(quantize.summary(calibration))
    return Scorable(qnet, path, {"int8": calibration})


def fuses(cfg, ctxs, dist):
    """Whether --mode val scores through oneDNN's fused graph: float32 or bfloat16 on one worker with one CPU
    context (several workers: Horovod's collectives cannot read the weights oneDNN has reordered). A bfloat16 run
    that fuses builds its network without AMP's operator patching (training.network.build_network): in an
    ``amp.init`` process AMP wraps the fused convolutions in float32 casts, 17 vs 42 images/s for ResNet-50."""
    return cfg.fit.mode == "val" and cfg.fit.dtype in ("float32", "bfloat16") and dist.size == 1 and \
        len(ctxs) == 1 and ctxs[0].device_type == "cpu"


def fused(cfg, net, ctxs, dist):
    """The loaded checkpoint through oneDNN's conv+BN+ReLU(+add) fusion (graph.inference's
    optimize_for_inference; to_bfloat16 casts the graph first)."""
    path = load_weights(net, cfg.fit, cfg.data.data_backend, ctxs, dist)
    shape = input_shape(cfg.data.image_shape, cfg.data.input_layout, cfg.fit.batch_size)
    fuse = to_bfloat16 if cfg.fit.dtype == "bfloat16" else optimize_for_inference
    return Scorable(fuse(net, shape, ctxs[0]), path)


def for_scoring(cfg, net, ctxs, dist, calibration_batches=None):
    """The fastest correct graph of the checkpoint to score for the run's dtype (``cfg``: the RunConfig)."""
    if cfg.fit.dtype == "int8":
        return int8_graph(cfg, net, ctxs, dist, calibration_batches)
    if fuses(cfg, ctxs, dist):
        return fused(cfg, net, ctxs, dist)
    return Scorable(net, load_weights(net, cfg.fit, cfg.data.data_backend, ctxs, dist))


def other_class_names(weights, data_val):
    """One line when the class names beside ``data_val`` (classes.txt, the .lst's folders) are not those the
    checkpoint ``weights`` was trained on: its scores count its labels, which there mean other classes."""
    saved, found = predict.checkpoint_class_names(weights), predict.dataset_class_names(data_val)
    if not saved or not found or list(saved) == list(found):
        return None
    differ = [f"{i}: {mine} here, {theirs} in training" for i, (mine, theirs) in enumerate(zip(found, saved))
              if mine != theirs][:3]
    return (f"the classes of {data_val} are not those {weights} was trained on ({len(found)} against "
            f"{len(saved)} classes; {'; '.join(differ) or 'one list longer'}): label i counts as its class i; "
            "score it on data of the same classes")


def latency_text(metrics, percentiles=(50, 90, 99)):
    """", latency per batch p50 5.1 ms, p90 5.3 ms, p99 6.0 ms": the pass's percentiles, as the report keeps them
    (val.latency_P, seconds per batch)."""
    shown = [f"p{p} {metrics[f'val.latency_{p}'][-1] * 1000:.1f} ms" for p in percentiles
             if metrics.get(f"val.latency_{p}")]
    return f", latency per batch {', '.join(shown)}" if shown else ""


def score(cfg, run, model, val_iter, ctxs, dist):
    """--mode val: --num-epochs passes over the validation data (with --benchmark-iters, that many batches per
    pass, the set cycled) of ``model`` (a Scorable); returns the report, which names the weights scored."""
    fit_cfg = cfg.fit
    if val_iter is None:
        raise ScoringError("--mode val needs validation data (--data-val)")
    net = model.net
    dist.broadcast_parameters(net)
    report = Report(model=run.model_name, ngpus=dist.size * len(ctxs), cmd=run.command,
                    untimed_iters=fit_cfg.untimed_iters)
    report.weights = os.path.abspath(model.weights) if model.weights else "fresh"
    report.info.update(model.info)
    report.info.update(val_tta=fit_cfg.val_tta, data_val=cfg.data.data_val and os.path.abspath(cfg.data.data_val))
    names = predict.class_names(cfg.predict.class_names, cfg.data.data_val or cfg.data.data_train, model.weights,
                                cfg.model.num_classes)
    if names:
        report.info["class_names"] = names
    problem = other_class_names(model.weights, cfg.data.data_val)
    if problem and dist.is_primary:
        log.warning("%s", problem)
    start = time.time()
    net = with_tta(net, fit_cfg.val_tta, cfg.data.input_layout)
    for epoch in range(fit_cfg.num_epochs):
        metrics = evaluate(net, val_iter, ctxs, dist, fit_cfg.dtype, fit_cfg.no_metrics, fit_cfg.benchmark_iters)
        values = {} if fit_cfg.no_metrics else {k: metrics[k] for k in ("top1", "top5", "loss")}
        report.add_epoch("val", durations=metrics["durations"], batch_size=fit_cfg.batch_size, **values)
        report.add_per_class(metrics["confusion"], epoch + 1)
        if dist.is_primary:
            log.info("Pass %d: %s%.1f img/s%s (%d samples)", epoch + 1,
                     "" if fit_cfg.no_metrics else f"top1 {metrics['top1']:.4f} top5 {metrics['top5']:.4f} ",
                     report.metrics.get("val.total_ips", [0.0])[-1] if metrics["durations"] else 0.0,
                     latency_text(report.metrics) if metrics["durations"] else "", metrics["samples"])
    report.total_duration = time.time() - start
    if dist.is_primary:
        report.save(workspace_path(fit_cfg.workspace, run.report_path))
    return report


def predictions_file(cfg):
    """The file --mode pred writes its rows to (--pred-out, a relative one from the current directory as any path
    typed; for many images without it, predictions.csv in --workspace, by default the checkpoint's folder), or
    None for one image's top classes, printed."""
    pcfg = cfg.predict
    if pcfg.pred_out:
        return os.path.abspath(pcfg.pred_out)
    if not predict_many.is_many(pcfg.data_pred):
        return None
    return workspace_path(cfg.fit.workspace, predict_many.DEFAULT_OUT)


def predict_image(cfg, model, ctxs, dist=None):
    """--mode pred: the top classes of --data-pred by ``model`` (a Scorable): one image's printed (returns them),
    or many images' written to --pred-out (returns predict_many's rows; several workers, ``dist``, share them)."""
    data, pcfg = cfg.data, cfg.predict
    names = predict.class_names(pcfg.class_names, data.data_train, model.weights, cfg.model.num_classes)

    def transform(path):
        return predict.load_image(path, data.image_shape, data.data_val_resize, data.rgb_mean, data.rgb_std,
                                  data.input_layout)
    net = with_tta(model.net, cfg.fit.val_tta, data.input_layout)
    out = predictions_file(cfg)
    if out is None:
        return predict.predict(net, transform(pcfg.data_pred), ctxs[0], cfg.fit.dtype, names,
                               pcfg.pred_top_k)

    def score(images):
        return predict.softmax_batch(net, images, ctxs[0], cfg.fit.dtype)
    predict.warn_about_names(names, cfg.model.num_classes)
    try:
        return predict_many.run(score, pcfg.data_pred, transform, cfg.fit.batch_size, pcfg.pred_top_k, names, out,
                                cfg.fit.disp_batches, dist)
    except predict_many.NoImages as error:
        raise ScoringError(str(error))
