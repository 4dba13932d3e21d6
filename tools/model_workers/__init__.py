"""tools/bench_models.py's worker processes: ours (MXNet: mxnet_steps) and PyTorch's (torch_steps) steps, the
loop a worker times them in on the driver's requests (serve), what both measure with (timing), and the oneDNN
kernel breakdown of a training step (breakdown). Importable without MXNet or PyTorch (the PyTorch worker's
Python has no MXNet): each library is imported where a worker builds its steps."""
