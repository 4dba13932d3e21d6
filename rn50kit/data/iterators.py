"""The iterator every backend hands fit.py (BatchIterator: the contract it relies on), the iterator of a process
driving several devices (PerDeviceIterator: one backend iterator per device), and the conversion of a non-DALI
batch to the network's layout and dtype."""
import math

import mxnet as mx


def to_layout(data, channels, dtype, layout):
    """A float32 NCHW batch from a non-DALI source as the network wants it: 4th zero channel, layout, dtype."""
    if channels == 4:
        data = mx.nd.concat(data, mx.nd.zeros_like(data.slice_axis(axis=1, begin=0, end=1)), dim=1)
    if layout == "NHWC":
        data = data.transpose((0, 2, 3, 1))
    return data.astype(dtype, copy=False)


class BatchIterator:
    """The contract fit.py relies on, shared by every backend: ``len()`` batches per epoch of ``size`` samples,
    one epoch per ``for`` (or ``reset()``), full-shape batches whose ``pad`` counts the trailing samples that
    are padding. A backend gives ``next_arrays(valid)``: the (data, label) of the next batch, of which the first
    ``valid`` samples count; and ``restart()`` if it must do something at the start of an epoch."""

    def __init__(self, size, batch_size):
        self.size = size
        self.batch_size = batch_size
        self._served = 0  # samples of this epoch handed out so far

    def __len__(self):
        return math.ceil(self.size / self.batch_size)

    def __iter__(self):
        self._served = 0
        self.restart()
        return self

    def reset(self):
        self.__iter__()

    def restart(self):
        pass

    def next_arrays(self, valid):
        raise NotImplementedError

    def __next__(self):
        if self._served >= self.size:
            raise StopIteration
        valid = min(self.batch_size, self.size - self._served)
        data, label = self.next_arrays(valid)
        self._served += valid
        return mx.io.DataBatch(data=[data], label=[label], pad=self.batch_size - valid)


class PerDeviceIterator:
    """Iterates one iterator per device together: each batch has one data and one label array per device and
    ``pads``, the padding of each part (``pad`` is their sum). Training shards have equal lengths; a validation
    shard that ends first repeats its last batch as all padding, so every part keeps its shape."""

    def __init__(self, iterators):
        self.iterators = list(iterators)

    def __len__(self):
        return max(len(iterator) for iterator in self.iterators)

    def __iter__(self):
        for iterator in self.iterators:
            iter(iterator)
        self._last = [None] * len(self.iterators)
        self._steps = 0
        return self

    def reset(self):
        self.__iter__()

    def __next__(self):
        if self._steps >= len(self):
            raise StopIteration
        self._steps += 1
        pads = []
        for i, iterator in enumerate(self.iterators):
            try:
                self._last[i] = next(iterator)
                pads.append(self._last[i].pad)
            except StopIteration:
                pads.append(None)  # all padding
        # A shard with no samples at all borrows another part's batch (split() moves it to its device).
        parts = [last if last is not None else next(b for b in self._last if b is not None) for last in self._last]
        pads = [pad if pad is not None else part.data[0].shape[0] for pad, part in zip(pads, parts)]
        batch = mx.io.DataBatch(data=[b.data[0] for b in parts], label=[b.label[0] for b in parts], pad=sum(pads))
        batch.pads = pads
        return batch
