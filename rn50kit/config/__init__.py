"""The configuration home, MXNet-free: every config dataclass and the flags that fill it (one module per concern),
train.py's whole parser and its checks (train_flags), config files and recipes (read when used), LR schedules, the
optimizers' table, a run's resolved config, and the settings a run takes when the user does not say."""
