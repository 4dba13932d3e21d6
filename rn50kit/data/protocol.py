"""What a data backend is: the one protocol the kit's backends share (docs/extending.md, "A data backend").

A backend is a row of the backends table (rn50kit/common/backends.py: its name, the files of its data root, where
its pipeline runs, what it supports) and a module holding the function the row names, a ``GetIterators``: it
returns this rank's (train, val) iterators, either None when its data is not given. An iterator keeps
iterators.BatchIterator's contract, all fit.py relies on: ``len()`` batches an epoch, one epoch per ``for`` (or
``reset()``), mx.io.DataBatch(data=[images], label=[labels], pad) on ``ctx``, of this rank's share of the global
batch, in the network's dtype (``out_dtype``) and --input-layout, full-shape batches whose ``pad`` counts the
trailing samples that are padding. Bad data raises DataError with one line (naming the record where it can).
"""
import dataclasses
import typing

from rn50kit.hardware import devices


class DataError(Exception):
    """Data that cannot be trained on (a bad record file, a record that does not decode): reported as one line."""


@dataclasses.dataclass(frozen=True)
class Feed:
    """What the pipelines need from the other concerns: the global batch, the network's input dtype, the seed
    and (synthetic data) the number of classes."""
    batch_size: int
    dtype: str = "float32"
    seed: int = None
    num_classes: int = 1000
    # An elastic run's epoch (training.elastic): the records of the permutation already read, and the steps left
    start: int = None
    steps: int = None


class GetIterators(typing.Protocol):
    """A backend's builder: (train, val) iterators for worker ``rank`` of ``num_workers`` (``local_rank`` of the
    ``local_size`` workers of its node), its batches on ``ctx``; ``cfg`` is the DataConfig (the data, augmentation
    and backend flags), ``feed`` the Feed. A backend whose row says ``elastic`` starts its training records at
    position ``feed.start`` of the epoch's permutation and gives ``feed.steps`` batches."""

    def __call__(self, cfg, feed: Feed, rank: int, num_workers: int, local_rank: int, local_size: int, ctx):
        ...


def default_threads(local_size):
    """CPU threads for one process's data pipeline: the cores shared by the processes of a node."""
    return max(1, devices.usable_cores() // max(1, local_size))  # the affinity mask (Slurm, cgroups), not the machine


def out_dtype(dtype):
    """The pipelines hand float16 to float16 nets; float32 and bfloat16 (cast inside AMP) get float32."""
    return "float16" if dtype == "float16" else "float32"
