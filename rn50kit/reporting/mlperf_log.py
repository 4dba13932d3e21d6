"""The optional MLPerf-style log (--mllog): ":::MLLOG {json}" lines written through MLCommons' mlperf-logging
package, with the keys its training rules for ResNet expect (ruleset 4.0.0, the last with ResNet: closed_common,
closed_resnet, closed_resnet_lars/sgd), so a run can be checked with

    python -m mlperf_logging.compliance_checker --usage training --ruleset 4.0.0 <workspace>/mllog.txt

One file describes one run from init_start to run_stop: a run stopped by a signal and resumed appends to it
(no second run_start). run_stop's status is "success" when --target-top1 was reached, "aborted" otherwise.
"""
import logging
import os
import platform

import rn50kit

SUBMISSION_ORG = "rn50-kit"  # the compliance rules want a non-empty organisation; this kit's users vary
RULESET = "4.0.0"


class MLPerfLog:
    """Rank 0 writes, the other ranks (and a run without --mllog) do nothing."""

    def __init__(self, path, fresh=True):
        """``fresh``: a new run (the file is started anew); else the resumed run's log is continued."""
        self.logger = None
        if not path:
            return
        from mlperf_logging import mllog  # imported only when asked for (fit_flags.check says when it is missing)
        self.c = mllog.constants
        handler = logging.FileHandler(path, mode="w" if fresh else "a")
        handler.setLevel(logging.INFO)
        logger = logging.getLogger(f"rn50.mllog.{os.path.abspath(path)}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        logger.handlers[:] = [handler]
        self.logger = mllog.mllog.MLLogger(logger=logger, root_dir=rn50kit.KIT_DIR)

    def close(self):
        if self.logger is not None:
            for handler in self.logger.logger.handlers:
                handler.close()
            self.logger.logger.handlers[:] = []

    def event(self, key, value=None, **metadata):
        if self.logger is not None:
            self.logger.event(key=key, value=value, metadata=metadata or None, stack_offset=2)

    def start(self, key, value=None, **metadata):
        if self.logger is not None:
            self.logger.start(key=key, value=value, metadata=metadata or None, stack_offset=2)

    def end(self, key, value=None, **metadata):
        if self.logger is not None:
            self.logger.end(key=key, value=value, metadata=metadata or None, stack_offset=2)

    def run_begins(self, cfg, workers, device, train_samples):
        """init_start, the submission and hyper-parameter keys, init_stop, run_start (a fresh run only)."""
        if self.logger is None:
            return
        c = self.c
        self.start(c.INIT_START)
        self.event(c.SUBMISSION_BENCHMARK, c.RESNET)
        self.event(c.SUBMISSION_ORG, SUBMISSION_ORG)
        self.event(c.SUBMISSION_DIVISION, "closed")
        self.event(c.SUBMISSION_STATUS, "research")
        self.event(c.SUBMISSION_PLATFORM, f"{workers}x{device} ({platform.machine()})")
        self.event(c.CACHE_CLEAR, False)  # the kit does not drop the OS's file caches (that needs root)
        effective = cfg.batch_size * cfg.grad_accum_steps
        self.event(c.GLOBAL_BATCH_SIZE, effective)
        self.event(c.GRADIENT_ACCUMULATION_STEPS, cfg.grad_accum_steps)
        self.event(c.TRAIN_SAMPLES, train_samples)
        self.event(c.OPT_NAME, cfg.optimizer)
        if cfg.optimizer == "lars":
            steps_per_epoch = train_samples // effective
            self.event(c.LARS_OPT_BASE_LEARNING_RATE, cfg.lr)
            self.event(c.LARS_OPT_END_LR, cfg.lr_end)
            self.event(c.LARS_OPT_LR_DECAY_POLY_POWER, cfg.lr_power)
            self.event(c.LARS_OPT_LR_DECAY_STEPS,
                       int(round((cfg.num_epochs - cfg.warmup_epochs) * steps_per_epoch)))
            self.event(c.LARS_EPSILON, cfg.lars_eps)
            self.event(c.LARS_OPT_LEARNING_RATE_WARMUP_EPOCHS, cfg.warmup_epochs)
            self.event(c.LARS_OPT_MOMENTUM, cfg.mom)
            self.event(c.LARS_OPT_WEIGHT_DECAY, cfg.wd)
            self.event("lars_opt_trust_coefficient", cfg.lars_eta)  # not a rule's key; MLPerf's name for eta
        else:
            self.event(c.OPT_BASE_LR, cfg.lr)
            self.event("opt_learning_rate_warmup_epochs", cfg.warmup_epochs)
            self.event("opt_weight_decay", cfg.wd)
            self.event("opt_momentum", cfg.mom)
            self.event("opt_learning_rate_decay_schedule", cfg.lr_schedule)
        self.event("label_smoothing", cfg.label_smoothing)
        self.event("num_epochs", cfg.num_epochs)
        self.end(c.INIT_STOP)
        self.start(c.RUN_START)

    def epoch_start(self, epoch):
        self.start(self.c.EPOCH_START if self.logger else None, epoch_num=epoch)

    def epoch_stop(self, epoch):
        self.end(self.c.EPOCH_STOP if self.logger else None, epoch_num=epoch)

    def eval_start(self, epoch):
        self.start(self.c.EVAL_START if self.logger else None, epoch_num=epoch)

    def eval_result(self, epoch, top1, samples, first):
        """eval_accuracy and eval_stop of the validation after ``epoch`` (1-based); eval_samples once, with the
        first."""
        if self.logger is None:
            return
        if first:
            self.event(self.c.EVAL_SAMPLES, int(samples))
        self.event(self.c.EVAL_ACCURACY, float(top1), epoch_num=epoch)
        self.end(self.c.EVAL_STOP, epoch_num=epoch)

    def run_ends(self, success, epoch):
        if self.logger is not None:
            self.end(self.c.RUN_STOP, status=self.c.SUCCESS if success else self.c.ABORTED, epoch_num=epoch)
