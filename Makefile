# dlcomm: `make demo` and `make test` each work on a fresh Debian machine with nothing
# installed before them. Everything goes into the active Python (PYTHON=...).
PYTHON ?= python3
PIP := $(PYTHON) -m pip
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
NP ?= 4
PYTEST_ARGS ?=

.PHONY: install install-mpi install-test demo test bench bench-peers bench-fl lint knobs-doc clean

# Open MPI from Debian's packages, only when mpirun is missing.
install-mpi:
	@if ! command -v mpirun >/dev/null 2>&1; then \
	  echo "== installing Open MPI (openmpi-bin, libopenmpi-dev) with apt-get"; \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q openmpi-bin libopenmpi-dev iproute2; \
	fi

install: install-mpi
	$(PIP) install -q -e '.[torch,bench]'

install-test: install-mpi
	$(PIP) install -q -e '.[torch,bench,test,split]'

demo: install
	dlcommrun -np $(NP) $(PYTHON) examples/torch_mnist.py --epochs 5

# MXNet's tests run first, in their own numpy-1.x venv (test-mxnet); the main run skips them.
# The lint (ruff and the layers contract) runs before the tests. The package is byte-compiled
# first: with PYTHONDONTWRITEBYTECODE set (as on CI machines) every rank of every multi-rank job
# would otherwise compile dlcomm's modules from source again (about 0.2 s of CPU per process).
test: install-test install-tensorflow lint test-mxnet
	$(PYTHON) -m compileall -q dlcomm frameworks >/dev/null
	$(PYTHON) -m pytest -q -p no:cacheprovider --timeout=900 --durations=12 tests \
	  --ignore-glob='tests/*/test_mxnet*' $(PYTEST_ARGS)

bench: install
	$(PYTHON) -m dlcomm.cli.main bench report --output docs/benchmarks.md

# ruff, then the import-linter contracts of .importlinter (the layers) and no import cycle,
# then unique test file names (pytest stops at collection on two of the same name).
lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) tests/check_layers.py
	$(PYTHON) tests/check_test_names.py

knobs-doc:
	$(PYTHON) -m dlcomm.config docs/knobs.md

clean:
	rm -rf build *.egg-info .pytest_cache

# Horovod as the peer (docs/peers.md): build it from its sdist against the installed torch
# (one line patched to C++17), then run the same workloads through Horovod and dlcomm in one
# job, both orders, PEER_REPEATS times, and the 200 x 40 KB fusion benchmark.
HOROVOD_VERSION ?= 0.28.1
PEER_REPEATS ?= 3
PEER_MODELS ?= mlp cnn

bench-peers: install
	$(PYTHON) -m dlcomm.tools.bench.horovod_peer install-horovod --version $(HOROVOD_VERSION)
	@uptime
	@for model in $(PEER_MODELS); do for order in horovod,dlcomm dlcomm,horovod; do \
	  for i in $$(seq $(PEER_REPEATS)); do \
	    echo "== synthetic benchmark: --model $$model --framework $$order (run $$i)"; \
	    dlcommrun -np $(NP) $(PYTHON) examples/torch_synthetic_benchmark.py \
	      --framework $$order --model $$model || exit 1; \
	  done; done; done
	dlcommrun -np $(NP) $(PYTHON) -m dlcomm.tools.bench.horovod_peer fusion
	@uptime

# Federated learning (docs/fl.md): dlcomm's simulation against Flower's (flwr[simulation],
# the fl-bench extra, in its own environment FLWR_VENV that sees this one's packages: flwr
# 1.41 pins protobuf<7), at 100 and 1000 clients, alternating; then the scheduler's arithmetic.
FLWR_VENV ?= .venv-flwr
FL_REPEATS ?= 3
FL_ROUNDS ?= 5

bench-fl: install
	@[ -x $(FLWR_VENV)/bin/python ] || { $(PYTHON) -m venv --system-site-packages $(FLWR_VENV) && \
	  echo '*' > $(FLWR_VENV)/.gitignore; }
	$(FLWR_VENV)/bin/python -m pip install -q 'flwr[simulation]==1.41.0'
	@uptime
	$(PYTHON) -m dlcomm.cli.main bench fl --np $(NP) --rounds $(FL_ROUNDS) --repeats $(FL_REPEATS) \
	  --flower-python $(FLWR_VENV)/bin/python --json fl_bench.json
	@uptime
	$(PYTHON) -m dlcomm.cli.main bench fl-schedule --clients 1000 --clients-per-round 100 \
	  --ranks $(NP) --rounds 50

# TensorFlow (docs/tensorflow.md): tensorflow-cpu 2.21.0 with Keras 3 into the active Python
# (the `tensorflow` extra). tests/multirank/test_tensorflow_multirank.py fails under CI=true
# without it.
install-tensorflow: install-mpi
	$(PIP) install -q -e '.[tensorflow]'

# MXNet (docs/mxnet.md): MXNet 1.9.1, the last release, needs numpy < 2, so its tests and
# example run in their own environment (MXNET_VENV) while the rest of dlcomm stays on
# current numpy. The venv holds numpy 1.23 (the last with numpy.bool, so `import mxnet` works
# in any order), mxnet, mpi4py, the test tools, scikit-learn (the example's digits) and dlcomm
# itself (editable; native kernels already built in the tree are used, not rebuilt).
# Set CI=1 to make a missing MXNet fail the tests instead of skipping them.
MXNET_VENV ?= .venv-mxnet
MXNET_PYTHON := $(MXNET_VENV)/bin/python

.PHONY: install-mxnet test-mxnet demo-mxnet

$(MXNET_PYTHON):
	$(PYTHON) -m venv $(MXNET_VENV)
	@echo '*' > $(MXNET_VENV)/.gitignore

install-mxnet: install-mpi $(MXNET_PYTHON)
	$(MXNET_PYTHON) -m pip install -q --upgrade pip
	$(MXNET_PYTHON) -m pip install -q 'numpy==1.23.5' 'mxnet==1.9.1' 'mpi4py>=3.1' \
	  'pytest>=7' pytest-timeout hypothesis scikit-learn
	DLCOMM_BUILD_NATIVE=0 $(MXNET_PYTHON) -m pip install -q --no-deps -e .

test-mxnet: install-mxnet
	$(MXNET_PYTHON) -m pytest -q -p no:cacheprovider --timeout=900 tests/*/test_mxnet*.py $(PYTEST_ARGS)

demo-mxnet: install-mxnet
	$(MXNET_VENV)/bin/dlcommrun -np 2 $(MXNET_PYTHON) examples/gluon_mnist.py
