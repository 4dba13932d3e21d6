"""Weights in and out of the kit's networks: published ImageNet ResNets (torchvision, timm, GluonCV)."""
