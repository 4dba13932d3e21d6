"""Scoring a network: top-1/top-5 over a validation set, INT8 quantization, prediction."""
