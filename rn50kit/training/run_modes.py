"""What a run does once started, by mode, apart from training itself (train.py's, through fit): --test-io times
the data pipeline, --mode pred predicts, --mode val scores; then every rank finishes together and rank 0 prints
the result lines."""
import dataclasses
import logging

from rn50kit.common import backends
from rn50kit.config.cli import UsageError
from rn50kit.data import io_timing, loaders
from rn50kit.scoring import scoring
from rn50kit.training import run_record


@dataclasses.dataclass
class Outcome:
    """What train.main() leaves behind: the network (trained or scored), and the report, the prediction or the
    data pipeline's rate, by mode."""
    net: object = None
    report: object = None
    stopped: bool = False
    prediction: list = None
    io: dict = None


def time_data_pipeline(cfg, ctxs, dist):
    """--test-io: the data pipeline alone, no network."""
    train_iter, val_iter = loaders.get_data_iterators_per_device(cfg, dist.rank, dist.size, dist.local_rank,
                                                              dist.local_size, ctxs)
    return Outcome(io=io_timing.test_io(cfg, train_iter, val_iter, dist))


def predict_images(cfg, info, net, ctxs, dist):
    """--mode pred: the checkpoint's prediction for one image (printed) or many (a file), then the configuration
    the prediction used (run_record.write_prediction_config)."""
    model = scoring.for_scoring(cfg, net, ctxs, dist, calibration_batches(cfg, dist, ctxs, None))
    prediction = scoring.predict_image(cfg, model, ctxs, dist)
    run_record.write_prediction_config(cfg, info, dist, ctxs)
    return Outcome(net=model.net, prediction=prediction)


def score_checkpoint(cfg, info, net, ctxs, dist):
    """--mode val: the checkpoint scored on the validation data, then the configuration the score used
    (run_record.write_score_config). Returns (the network scored, the report)."""
    train_iter, val_iter = loaders.get_data_iterators_per_device(cfg, dist.rank, dist.size, dist.local_rank,
                                                              dist.local_size, ctxs)
    model = scoring.for_scoring(cfg, net, ctxs, dist, calibration_batches(cfg, dist, ctxs, train_iter))
    report = scoring.score(cfg, info, model, val_iter, ctxs, dist)
    run_record.write_score_config(cfg, info, dist, ctxs)
    return model.net, report


def calibration_batches(cfg, dist, ctxs, train_iter):
    """--dtype int8's calibration data: a function giving training batches (the run's own iterator if any)."""
    def batches():
        if train_iter is not None:
            return train_iter
        if backends.reads_records(cfg.data.data_backend) and not cfg.data.data_train:
            raise UsageError("--dtype int8 calibrates on training records: give --data-train (or run once with it: "
                             "the INT8 graph is kept beside the checkpoint)")
        return loaders.get_data_iterators(cfg, dist.rank, dist.size, dist.local_rank, dist.local_size, ctxs[0])[0]
    return batches


def finish_run(cfg, info, dist, lock, report, stopped):
    """Every rank finishes together; then rank 0 tells runner how the run ended (the lock) and prints the result
    lines and the report's path."""
    dist.finish()
    if lock is not None and dist.is_primary:  # every rank has finished cleanly: tell runner how
        lock.finish("stopped" if stopped else "done")
    if not dist.is_primary:
        return
    top1 = report.metrics.get("val.top1")
    if top1:
        print(f"Validation top-1: {top1[-1]:.4f}")
    target = report.info.get("target")
    if target:
        print(f"Target top-1 {target['top1']:g} reached at epoch {target['epoch']} after "
              f"{target['train_seconds']:.0f} s of training, {target['wall_seconds']:.0f} s in all")
    path = run_record.absolute_report_path(cfg, info)
    print(f"Report: {path}")
    write_confusion_png(report, path)


def write_confusion_png(report, report_file):
    """Rank 0, after the report: the latest validation's confusion matrix (or most confused pairs) as a PNG beside
    it; a machine without matplotlib gets a warning."""
    if not report.per_class:
        return None
    from rn50kit.reporting import report as reports
    try:
        path = reports.save_confusion_png(report.per_class, reports.confusion_png_path(report_file))
    except ImportError as error:
        logging.warning("No confusion-matrix PNG (%s); the per-class results are in the report", error)
        return None
    print(f"Per-class results: {report_file} (\"per_class\"), confusion matrix {path}")
    return path
