"""Weights in and out of the kit's networks: its own checkpoints (checkpoint, optimizer_state: written so that a
kill never breaks one, read without pickle) and published ImageNet ResNets (torchvision, timm, GluonCV)."""
