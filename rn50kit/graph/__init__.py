"""The kit's networks as MXNet graphs and parameter files: loading a checkpoint's parameters into a network,
writing and reading symbol files, and the inference-only graphs (oneDNN's fusions, bfloat16). models.py builds
the networks; nothing here imports it."""
