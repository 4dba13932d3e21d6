"""The outputs a training run has, one row each, in the order every event reaches them. A row names an Output
class as "module:Class"; the run opens it with the class's ``open(context)`` (outputs.OutputContext), on every
rank, at its start and again for an elastic run's new world. Adding an output is one new module and one row here
(docs/extending.md, "An output"). The rows are imported when a run opens its outputs, not before."""
import importlib

from rn50kit.reporting.outputs import Outputs

OUTPUTS = (
    "rn50kit.reporting.outputs:Console",  # the progress bar or lines, the epochs' summary lines
    "rn50kit.reporting.outputs:JsonLines",  # --json-log
    "rn50kit.reporting.outputs:ReportOutput",  # --report (report.json)
    "rn50kit.reporting.outputs:MLPerf",  # --mllog
    "rn50kit.reporting.summary_csv:SummaryCsv",  # summary.csv
    "rn50kit.reporting.tensorboard_log:TensorBoard",  # --tensorboard DIR
    "rn50kit.config.resolved_config:ResolvedConfig",  # config.toml
)


def output_class(row):
    """The class a row names ("module:Class")."""
    module, _, name = row.partition(":")
    return getattr(importlib.import_module(module), name)


def open_outputs(context, rows=None):
    """The Outputs of a run: every row's class opened for ``context`` (those whose ``open`` gives None left out);
    ``rows``: OUTPUTS unless given."""
    opened = (output_class(row).open(context) for row in (OUTPUTS if rows is None else rows))
    return Outputs([output for output in opened if output is not None])
