"""train.py's configuration: one frozen, typed config per concern, each beside the flags that set it, in this folder
(model_flags.ModelConfig, data_flags.DataConfig, fit_flags.FitConfig, finetune_flags.FinetuneConfig,
scoring_flags.QuantizeConfig and PredictConfig, faults_flags.WatchdogConfig). Every flag of train.py is a field of
exactly one of them; their defaults are the flags' defaults. The entry point builds a RunConfig once from the parsed
and completed flags and passes it down: no argparse Namespace goes past train.py."""
import dataclasses

from rn50kit.config.cli import config_from
from rn50kit.config.data_flags import DataConfig
from rn50kit.config.faults_flags import WatchdogConfig
from rn50kit.config.finetune_flags import FinetuneConfig
from rn50kit.config.fit_flags import FitConfig
from rn50kit.config.model_flags import ModelConfig
from rn50kit.config.scoring_flags import PredictConfig, QuantizeConfig

CONFIGS = {"model": ModelConfig, "data": DataConfig, "fit": FitConfig, "finetune": FinetuneConfig,
           "quantize": QuantizeConfig, "predict": PredictConfig, "watchdog": WatchdogConfig}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything one run of train.py was asked to do, by concern."""
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    fit: FitConfig = FitConfig()
    finetune: FinetuneConfig = FinetuneConfig()
    quantize: QuantizeConfig = QuantizeConfig()
    predict: PredictConfig = PredictConfig()
    watchdog: WatchdogConfig = WatchdogConfig()

    def replace(self, **changes):
        """A copy with fields changed, named concern__field (e.g. fit__seed=3): a config is never changed in place."""
        parts = {}
        for key, value in changes.items():
            concern, field = key.split("__")
            parts.setdefault(concern, {})[field] = value
        return dataclasses.replace(self, **{concern: dataclasses.replace(getattr(self, concern), **fields)
                                            for concern, fields in parts.items()})


def owner(dest):
    """The concern whose config holds flag destination ``dest``, or None."""
    return next((name for name, cls in CONFIGS.items() if dest in {f.name for f in dataclasses.fields(cls)}), None)


def from_args(args):
    """The RunConfig of parsed (and completed) flags."""
    return RunConfig(**{name: config_from(cls, args) for name, cls in CONFIGS.items()})
