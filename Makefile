# dlcomm: `make demo` and `make test` each work on a fresh Debian machine with nothing
# installed before them. Everything goes into the active Python (PYTHON=...).
PYTHON ?= python3
PIP := $(PYTHON) -m pip
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
NP ?= 4
PYTEST_ARGS ?=

.PHONY: install install-mpi install-test demo test bench bench-peers lint knobs-doc clean

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
	$(PIP) install -q -e '.[torch,bench,test]'

demo: install
	dlcommrun -np $(NP) $(PYTHON) examples/torch_mnist.py --epochs 5

test: install-test
	$(PYTHON) -m pytest -q -p no:cacheprovider --timeout=900 tests $(PYTEST_ARGS)

bench: install
	$(PYTHON) -m dlcomm.cli.main bench report --output docs/benchmarks.md

lint:
	$(PYTHON) -m ruff check .

knobs-doc:
	$(PYTHON) -m dlcomm.config > docs/knobs_table.md

clean:
	rm -rf build *.egg-info .pytest_cache

# TensorFlow (docs/tensorflow.md): tensorflow-cpu 2.21.0 with Keras 3 into the active Python
# (the `tensorflow` extra). tests/test_tensorflow_multirank.py fails under CI=true without it.
install-tensorflow: install-mpi
	$(PIP) install -q -e '.[tensorflow]'
