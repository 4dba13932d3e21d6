from setuptools import find_packages, setup

# The card's modules, where the original kit's users know them; everything else is in the rn50kit package.
CARD_MODULES = ["train", "fit", "models", "dali", "benchmark"]

TENSORBOARD = ["tensorboardX==2.6.5", "protobuf==7.36.2"]  # --tensorboard's writer (no TensorFlow or PyTorch)
ONNX = [
    "onnx==1.15.0",
    'onnxruntime==1.31.1; python_version >= "3.11"',
    'onnxruntime==1.23.2; python_version < "3.11"',  # its last release for Python 3.10
    "protobuf==7.36.2",
    "flatbuffers==25.12.19",
]

setup(
    name="rn50-kit",
    version="0.1.0",
    description="ResNet training and benchmarking kit on MXNet Gluon, Horovod and NVIDIA DALI",
    python_requires=">=3.10,<3.12",
    py_modules=CARD_MODULES,
    packages=find_packages(include=["rn50kit", "rn50kit.*"]),
    package_data={
        "rn50kit.config": ["recipes/*.toml"],  # the shipped recipes (rn50kit.config.recipe.RECIPES_DIR)
        "rn50kit.common": ["imagenet_classes.tsv"],  # the ImageNet-1k class names (imagenet_classes.classes)
    },
    scripts=["runner"],
    # MXNet is left out on purpose: the CPU build (mxnet) and the GPU builds (mxnet-cu112, ...) are
    # different distributions of the same package; the Makefile installs the one asked for.
    # Horovod is built from source against that MXNet by tools/install_horovod.sh.
    install_requires=[
        "numpy>=1.23,<1.24",
        "opencv-python-headless>=4.8",
        "nvidia-dali-cuda120>=2.0",
        "scikit-learn>=1.3",
        "safetensors>=0.4",  # --pretrained: torchvision/timm weights without PyTorch
        "tomli-w==1.2.0",  # every run's resolved config.toml
        'tomli==2.2.1; python_version < "3.11"',  # reading TOML: the standard library's tomllib from 3.11 on
    ],
    extras_require={
        # ONNX export (tools/export_onnx.py): MXNet's exporter imports onnx.mapping, removed in onnx 1.16
        "onnx": ONNX,
        # the optional MLPerf log (--mllog) and MLCommons' checkers; pandas: a release that works with numpy 1.23
        "mlperf": ["mlperf-logging==4.1.68", "pandas==2.3.3"],
        "tensorboard": TENSORBOARD,
        # tensorboard: its own reader (EventAccumulator) checks the event files --tensorboard writes
        "test": ["pytest==9.2.0", "pytest-xdist==3.8.0", "ruff==0.17.6", "tensorboard==2.21.0"] + ONNX + TENSORBOARD,
    },
)
