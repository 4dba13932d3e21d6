"""The kit's library: everything but the card's modules (train.py, fit.py, models.py, dali.py, benchmark.py), in
folders by layer. The folders marked MXNet-free import without MXNet (runner, benchmark.py and tools/ use them
before choosing a Python); tests/unit/test_layers.py checks that they do.

- common/       MXNet-free: the vocabulary every command shares: the data backends' table, the --help format, the
                run rules, ImageNet's class names
- launch/       MXNet-free: runner's command line, its launch plans and checks, the launchers (horovodrun, elastic,
                mpirun, srun), the supervision of a run, the devices, the memory a configuration needs
- reliability/  MXNet-free: one run per workspace, faults told in one line, the stall watchdog, the world of
                workers, the fault campaign's parts
- reporting/    MXNet-free: the outputs of a run (progress, JSON log, report, MLPerf log)
- benchmarking/ MXNet-free: benchmark.py's parts (runs, results, tables, chart, sweep) and what the benchmark tools
                share
- config/       MXNet-free: every config and the flags that fill it, config files, recipes, LR schedules, the
                optimizers' table, train.py's parser, the settings a run takes when the user does not say
- data/         RecordIO files, the data backends (a module each) and their iterators, --test-io
- training/     the loop's parts: checkpoints, optimizers, mixed precision, collectives, the checks before a run;
                the steps of train.py's run (worker, start_checks, announce, workspace, network, run_modes ...)
- graph/        a network's files and graphs: parameters loaded, symbol files, oneDNN's inference graph
- weights/      published weights into the kit's networks
- scoring/      top-1/top-5 scoring, INT8 quantization, prediction
"""
import os

KIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where train.py and the card's modules are
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def is_kit_file(path):
    """Whether ``path`` is one of the kit's own modules (the card's on top or the package's; not a library's)."""
    path = os.path.abspath(path)
    return os.path.dirname(path) == KIT_DIR or path.startswith(PACKAGE_DIR + os.sep)
