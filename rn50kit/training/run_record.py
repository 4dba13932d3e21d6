"""What a run records of itself: its RunInfo (what the kit derived, apart from what the user typed), where its
report goes, and its resolved configuration, written into the workspace by training, beside the report by
scoring and beside the predictions by prediction (`./runner --config` or `train.py --config` replays each)."""
import dataclasses
import os

import rn50kit
from rn50kit.config import config_files, recipe, resolved_config, settings, train_config
from rn50kit.data import identity
from rn50kit.scoring import predict, scoring
from rn50kit.training import state
from rn50kit.training.prelaunch import TRAINING_MODES
from rn50kit.weights import checkpoint


def json_values(namespace):
    """The values of ``namespace`` a JSON state file keeps (None and objects left out)."""
    return {k: v for k, v in vars(namespace).items() if isinstance(v, (int, float, str, list))}


def run_info(cfg, resolved, typed, given, command):
    """state.RunInfo: what this run derived, apart from what the user typed. ``resolved``: json_values of the
    completed arguments; ``typed``: of the arguments as parsed, before the kit filled in the defaults that depend
    on the machine, the data, the recipe or a checkpoint."""
    model_name = cfg.model.name
    report_path = cfg.fit.report or ("score.json" if cfg.fit.mode == "val" else "report.json")
    derived = {k: v for k, v in resolved.items() if typed.get(k) != v}
    derived.update(model_name=model_name, report=report_path)
    files = {"config_file": cfg.fit.config, "recipe_file": str(recipe.recipe_file(cfg.fit.recipe).resolve())}
    record = {"args": resolved, "given": sorted(given), "derived": derived, **files}
    report_info = dict(files)
    if cfg.fit.mode in TRAINING_MODES:  # the data's class names travel into every checkpoint
        names = predict.training_class_names(cfg.predict.class_names, cfg.data.data_train, cfg.data.data_val,
                                             cfg.model.num_classes)
        if names:
            record["class_names"] = names
            report_info["class_names"] = predict.readable(names)
        # which records it trains on, so a resume on other ones is refused (fit.resume)
        record["train_records"] = identity.records_identity(cfg.data.data_train, cfg.data.data_train_idx)
    return state.RunInfo(model_name=model_name, arch=cfg.model.arch, command=list(command), report_path=report_path,
                         record=record, report_info=report_info)


def absolute_report_path(cfg, info):
    """The absolute path of the run's report (a relative --report is inside the workspace)."""
    return os.path.abspath(checkpoint.workspace_path(cfg.fit.workspace, info.report_path))


def resolved_tables(cfg, info, workers):
    """A run's configuration as TOML tables: every field of every config as the run used it, the workers for
    runner, and a record of the kit and the files read (not settings). --config is in the record: the file
    written replaces it."""
    tables = {name: {key: value for key, value in dataclasses.asdict(getattr(cfg, name)).items() if key != "config"}
              for name in train_config.CONFIGS}
    tables["runner"] = {"ngpus": workers}
    record = {"config_file": info.record.get("config_file"), "recipe_file": info.record.get("recipe_file")}
    tables[config_files.RECORD_TABLE] = {**config_files.kit_identity(rn50kit.KIT_DIR), **record}
    return resolved_config.with_absolute_paths(tables)


def runner_workers(dist, ctxs):
    """runner's -n for this run: its GPUs, else its processes."""
    return dist.size * (len(ctxs) if ctxs[0].device_type == "gpu" else 1)


def with_resolved_config(cfg, info, dist, ctxs):
    """``info`` with the run's resolved configuration, which training writes into its workspace as it starts
    (rn50kit/config/resolved_config.py) and `./runner --config` replays."""
    return dataclasses.replace(info, resolved_config=resolved_tables(cfg, info, runner_workers(dist, ctxs)))


def score_config_path(report_path):
    """runs/x/model-0002.float32.score.json -> runs/x/model-0002.float32.score.config.toml: a score's resolved
    configuration beside its report, so each checkpoint, dtype and calibration keeps its own."""
    stem = report_path[:-len(".json")] if report_path.endswith(".json") else report_path
    return stem + ".config.toml"


def write_score_config(cfg, info, dist, ctxs):
    """Rank 0 of a scoring run that got its score writes the configuration it used beside the report (a refused
    run leaves an earlier one as it was)."""
    if dist.is_primary:
        config_files.write_resolved(score_config_path(absolute_report_path(cfg, info)),
                                    resolved_tables(cfg, info, runner_workers(dist, ctxs)))


def prediction_config_path(cfg):
    """Where a prediction's resolved configuration goes: beside its file of predictions (predictions.csv ->
    predictions.config.toml), or, for one image's printed top classes, beside the checkpoint as a score's
    (model-0002.params -> model-0002.float32.pred.config.toml)."""
    out = scoring.predictions_file(cfg)
    if out is not None:
        return os.path.abspath(os.path.splitext(out)[0] + ".config.toml")
    tag = settings.score_tag(cfg.fit.dtype, cfg.quantize.calib_mode, cfg.quantize.calib_batches)
    return os.path.abspath(f"{os.path.splitext(cfg.fit.load)[0]}.{tag}.pred.config.toml")


def write_prediction_config(cfg, info, dist, ctxs):
    """Rank 0 of a prediction that got its predictions writes the configuration it used (prediction_config_path)."""
    if dist.is_primary:
        config_files.write_resolved(prediction_config_path(cfg),
                                    resolved_tables(cfg, info, runner_workers(dist, ctxs)))
