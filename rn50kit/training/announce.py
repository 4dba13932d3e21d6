"""What a run says as it starts: labels beyond --num-classes refused, rank 0's warnings about likely mistakes
that still run, then its header line (what runs, on what, and where the results go)."""
import logging
import os

from rn50kit.common import backends
from rn50kit.config.cli import UsageError
from rn50kit.data import protocol, record_files
from rn50kit.scoring import scoring
from rn50kit.training.prelaunch import TRAINING_MODES
from rn50kit.weights import checkpoint


def announce_run(cfg, info, dist):
    """Scoring without a checkpoint refused before the header line says what would be scored; the warnings, then
    rank 0's header line."""
    if cfg.fit.mode in ("val", "pred"):
        problem = scoring.no_checkpoint_problem(cfg.fit, cfg.data.data_backend)
        if problem:
            raise UsageError(problem)
    warn_about(cfg, dist.is_primary)
    if dist.is_primary and cfg.fit.mode != "pred":
        logging.info("%s", header(cfg, dist.size, info.report_path))


def header(cfg, size, report_path):
    """One line on what runs and where its results go (every argument is in the JSON log)."""
    fit_cfg, data_cfg = cfg.fit, cfg.data
    model = f"{cfg.model.name} ({cfg.model.num_classes} classes, " \
            f"{'x'.join(str(v) for v in data_cfg.image_shape)})"
    per_worker = f" ({fit_cfg.batch_size // size} per worker)" if size > 1 else ""
    batch = f"global batch {fit_cfg.batch_size}{per_worker}" if fit_cfg.grad_accum_steps == 1 else \
        f"global batch {fit_cfg.batch_size}{per_worker} x {fit_cfg.grad_accum_steps} accumulated = " \
        f"{fit_cfg.batch_size * fit_cfg.grad_accum_steps}"
    machine = f"{size} worker(s), {batch}, {fit_cfg.dtype}, {data_cfg.data_backend}"
    if fit_cfg.mode == "val":
        return (f"Scoring {fit_cfg.load or 'freshly initialised weights'}: {model}, resize {data_cfg.data_val_resize}, "
                f"{machine}; data {data_cfg.data_val or 'synthetic'}; "
                f"results in {checkpoint.workspace_path(fit_cfg.workspace, report_path)}")
    data_files = data_cfg.data_backend if not backends.reads_records(data_cfg.data_backend) else \
        ", ".join(f for f in (data_cfg.data_train, data_cfg.data_val) if f)
    if data_cfg.test_io:  # no model runs: the pipeline's batches only
        return f"Timing the input pipeline ({data_cfg.test_io_mode}) for {model} on {machine}; data {data_files}"
    return (f"Training {model} on {machine}; recipe {fit_cfg.recipe}, LR {fit_cfg.lr:g}, {fit_cfg.num_epochs} "
            f"epochs; data {data_files}; results in {os.path.join(fit_cfg.workspace, '')}")


def warn_about(cfg, primary):
    """Refuse labels beyond --num-classes (every rank); rank 0 warns once about likely mistakes that still run."""
    warning = None
    if cfg.fit.mode != "pred":
        warning = labels_warning(cfg)
    if not primary:
        return
    if warning:
        logging.warning(warning)
    fit_cfg = cfg.fit
    trains = fit_cfg.mode in TRAINING_MODES
    if trains and backends.reads_records(cfg.data.data_backend) and cfg.data.data_train:
        records = len(record_files.open_record_files(cfg.data)["train"])
        if fit_cfg.batch_size > records:
            logging.warning("--batch-size %d (global) is larger than the %d training records: every step repeats "
                            "records to fill the batch; use --batch-size %d or less", fit_cfg.batch_size, records,
                            records)
    if trains and fit_cfg.warmup_epochs and fit_cfg.warmup_epochs >= fit_cfg.num_epochs:
        logging.warning("--warmup-epochs %g is not shorter than --num-epochs %d: the LR never reaches its peak "
                        "(%g); lower --warmup-epochs", fit_cfg.warmup_epochs, fit_cfg.num_epochs, fit_cfg.lr)


def labels_warning(cfg):
    """A UsageError for labels the network cannot have (the file and record named), else the warning about the
    class count, or None."""
    try:
        labels = record_files.record_labels(cfg.data)  # the index check reads every record header, label included
        error = record_files.label_problem(cfg.data, cfg.model.num_classes)  # names the file and record
    except protocol.DataError as bad:
        raise UsageError(str(bad))
    if error:
        raise UsageError(error)
    error, warning = record_files.class_count_problem(cfg.data.data_train, cfg.data.data_val, cfg.model.num_classes,
                                                  labels)
    if error:
        raise UsageError(error)
    return warning
