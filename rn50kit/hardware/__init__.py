"""What this machine and its MXNet build can do, asked by runner and train.py alike, without MXNet at import: the
devices of a run (devices), the memory a configuration needs on them (memory), and the answers only MXNet gives
(mxnet_answers, asked of another Python and kept)."""
