# The kit in NVIDIA's MXNet container (docs/gpu.md): the container's MXNet (NVIDIA's build, with kernels for H100 and
# the fused BatchNorm ops), numpy, Horovod and Open MPI are kept; the kit's own packages are added by the same
# set-up as `make setup-container`, which ends by printing what it found.
#   docker build -t rn50-kit .                        NVIDIA's MXNet 24.06 (Python 3.10)
#   docker build --build-arg TAG=24.05 -t rn50-kit .
#   docker run --gpus all --ipc=host --rm -it -v /data/imagenet:/data/imagenet rn50-kit    the self-check first
ARG TAG=24.06
FROM nvcr.io/nvidia/mxnet:${TAG}-py3
WORKDIR /workspace/rn50
COPY . .
RUN tools/setup_container.sh python
CMD ["python", "tools/gpu_check.py"]
