"""The training loop's parts: checkpoints, optimizers, mixed precision and the collectives over Horovod's ranks."""
