# make demo   set up .venv, build the demo dataset, train on it with 2 Horovod workers
# make test   set up .venv, run the test suite (make test-fast: the in-process tests, tests/unit, under 45 s on a
#             quiet 2-core machine; the budgets and how to measure them: docs/design.md, Test budgets)
# make lint   ruff over the tree (pyproject.toml; the fast lane runs it too, as tests/unit/test_lint.py)
#
# Variables: PYTHON (a Python 3.10 or 3.11, default python3.11), MXNET (the MXNet distribution: mxnet==1.9.1 is the
# CPU build; e.g. MXNET=mxnet-cu112==1.9.1 for CUDA 11 GPUs, best with its own VENV=.venv-gpu), WHEEL_CACHE
# (where the Horovod wheel built against that MXNet is kept between set-ups). Horovod gets MPI when Open MPI is
# installed (`apt-get install openmpi-bin libopenmpi-dev`, or `module load openmpi`), NCCL with a CUDA MXNet.
PYTHON ?= python3.11
VENV ?= .venv
MXNET ?= mxnet==1.9.1
WHEEL_CACHE ?= $(HOME)/.cache/rn50-kit/wheels
BIN := $(VENV)/bin
# Installing Open MPI later must rebuild Horovod with MPI (tools/install_horovod.sh picks it when mpicc is found).
WITH_MPI := $(if $(filter 1,$(HOROVOD_WITHOUT_MPI)),,$(if $(shell command -v mpicc),-mpi))
STAMP := $(VENV)/.setup-$(subst =,-,$(MXNET))$(WITH_MPI)
DEMO_DATA ?= data/demo
DEMO_RUN ?= runs/demo

.PHONY: setup setup-container demo test test-fast test-container lint clean

setup: $(STAMP)

$(STAMP): setup.py requirements.txt tools/install_horovod.sh Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -c 'import sys; sys.path.insert(0, "."); from rn50kit.common import supported; supported.require_supported_python("make setup")' || { rm -rf $(VENV); exit 1; }
	$(BIN)/python -m pip install -q --upgrade pip==26.3 wheel==0.48.0 "setuptools==84.2.1" "cmake==3.31.10"
	$(BIN)/python -m pip install -q "$(MXNET)" -r requirements.txt
	tools/install_horovod.sh $(BIN)/python $(WHEEL_CACHE)
	$(BIN)/python -m pip install -q -e ".[test]"
	@$(BIN)/horovodrun --check-build > $(VENV)/horovod-check-build.txt
	@features="$$(tools/install_horovod.sh --features $(BIN)/python)"; for feature in $$features; do \
		grep -q "\[X\] $$feature" $(VENV)/horovod-check-build.txt || { cat $(VENV)/horovod-check-build.txt; \
		echo "error: Horovod was built without $$feature; delete its wheel in $(WHEEL_CACHE) and rerun" >&2; exit 1; }; \
	done; echo "Horovod:" $$features "available"
	@touch $@

demo: setup
	$(BIN)/python tools/make_demo_data.py $(DEMO_DATA)
	$(BIN)/python runner -n 2 -b 32 -e 16 -l 0.8 --dtype float32 --data-backend dali-cpu --data-root $(DEMO_DATA) \
		--num-layers 18 --num-classes 10 --image-shape 3,32,32 --data-val-resize 32 \
		--min-random-area 0.5 --random-mirror 0 --warmup-epochs 2 --seed 1 --workspace $(DEMO_RUN)
	@echo; $(BIN)/python -m rn50kit.reporting.report $(DEMO_RUN)/report.json

# Two pytest-xdist workers, each taking whole test files (their module fixtures are built once): much of the suite
# waits on other processes (start-up, stall timeouts, launches over SSH), so two share even a 2-core machine well.
# A third made a fresh-clone CI slower on 2 cores (51 minutes of tests against 39: each test about twice as long).
TEST_WORKERS ?= 2
# Python's bytecode caches written even where the environment turns them off (PYTHONDONTWRITEBYTECODE=1, as in some
# containers and CI images): pytest rewrites every test module it imports, about 4 s of each worker's start, and
# keeps the result only in them.
PYTEST := PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest

test: setup
	$(PYTEST) -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=40 tests

test-fast: setup
	$(PYTEST) -q -n $(TEST_WORKERS) --dist loadfile tests/unit

# Inside NVIDIA's MXNet container (docs/gpu.md): keep its MXNet, numpy, Horovod and Open MPI, add only the kit's
# packages, and print what was found. CONTAINER_PYTHON: the container's Python.
CONTAINER_PYTHON ?= python
setup-container:
	tools/setup_container.sh $(CONTAINER_PYTHON)

# The container's lane, on a machine without the container: a Python 3.10 environment that stands in for it
# (PyPI's MXNet 1.9.1 and numpy, Horovod built once and then treated as the container's), the in-container set-up
# on top, then the unit tests and the container route's commands (tests/e2e/test_container_route.py).
STANDIN_PYTHON ?= python3.10
STANDIN_VENV ?= .venv-container
STANDIN := $(STANDIN_VENV)/.standin$(WITH_MPI)

$(STANDIN): tools/install_horovod.sh
	@test -x $(STANDIN_VENV)/bin/python || $(STANDIN_PYTHON) -m venv $(STANDIN_VENV)
	$(STANDIN_VENV)/bin/python -m pip install -q --upgrade pip==26.3 wheel==0.48.0 "setuptools==84.2.1" "cmake==3.31.10"
	$(STANDIN_VENV)/bin/python -m pip install -q "mxnet==1.9.1" $$(grep -E '^(numpy|cloudpickle|psutil|PyYAML|packaging|cffi)==' requirements.txt)
	tools/install_horovod.sh $(STANDIN_VENV)/bin/python $(WHEEL_CACHE)
	@touch $@

test-container: $(STANDIN)
	tools/setup_container.sh $(STANDIN_VENV)/bin/python --with-tests
	PYTHONDONTWRITEBYTECODE= $(STANDIN_VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile \
		--durations=10 tests/unit \
		tests/e2e/test_container_route.py tests/e2e/test_self_check.py::test_self_check_on_this_cpu_machine

lint: setup
	$(BIN)/python -m ruff check .

clean:
	rm -rf $(VENV) $(STANDIN_VENV) $(DEMO_DATA) $(DEMO_RUN)
