"""The data a run reads: RecordIO files and the data backends' iterators."""
