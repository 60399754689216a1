# hvdlite developer entry points.
#
#   make install   .venv/, missing Debian and pip packages, editable build of hvdlite (with the
#                  NCCL module where nvcc is found: the NCCL wheel is installed then; HVDLITE_WITH_CUDA=0
#                  skips it, =1 requires it)
#   make demo      install, then a 2-process data-parallel training run (examples/pytorch_digits.py)
#   make test      install, then the test suite (without tests marked slow unless CI is set)
#   make test-all  install, then the whole test suite, slow tests included (what CI runs)
#   make bench     install, then every benchmark and benchmarks/results/report.md (after `make horovod`):
#                  under 15 minutes; BENCH_FULL=1 for the long sweep (benchmarks/_suite.py)
#   make horovod   Horovod 0.28.1 (gloo + PyTorch) in .venv-horovod/, the benchmarks' Horovod peer
#   make horovod-suite   install, then Horovod 0.28.1's own test file SUITE (default test_tensorflow.py),
#                  unchanged, on 2 ranks (tests/horovod_suite.py; Horovod's sources from HOROVOD_SRC;
#                  HOROVOD_SUITE_ARGS="--legacy-keras" etc.); says so and passes where there are none
#   make gpu-check on a machine with a CUDA GPU and a CUDA torch (no venv needed): builds with the
#                  NCCL module required, runs the GPU tests and benchmarks/gpu_one_rank.py (tests/gpu_check.sh)
#   make install-horovod-compat   opt-in: the `horovod` package and `horovodrun` over hvdlite
#                  (distribution hvdlite-horovod-compat from compat/; refuses over a real Horovod)
#   make docs      install, then the HTML site in docs/_build/html/ (Sphinx: docs/*.md and the API
#                  reference from the docstrings, warnings as errors, then a check of every internal link)
#   make lint      ruff check + ruff format --check (Python), mypy (hvdlite/), clang-format (csrc/)
#   make format    apply ruff format, ruff's safe fixes and clang-format
#   make build     incremental rebuild of the C++ core only (what install runs last)
#   make clean     remove build outputs (build/, hvdlite/_core*.so); distclean also removes .venv/
#
# install is idempotent and quick when nothing changed: the apt step checks each package with
# dpkg-query (a few ms), the pip and editable-install steps are stamp files in .venv/ keyed on
# requirements-dev.txt / setup.py / pyproject.toml, and the build step is CMake's incremental build.

SHELL := /bin/bash
.DEFAULT_GOAL := install

# Interpreter that creates .venv/.
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
# Debian packages the build needs: libssl-dev for libcrypto (csrc/common/crypto.h); Open MPI for the mpi backend, mpirun, mpi4py and the benchmarks' peer; openssh-server for the simulated-hosts tests (tests/simhosts.py); Slurm's daemons and commands for the Slurm tests (tests/simslurm.py).
APT_PACKAGES := cmake g++ make libssl-dev libopenmpi-dev openmpi-bin openssh-server slurmctld slurmd slurm-client
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
PYTEST_ARGS ?=

# One compute thread per rank: the machines have 2 cores and tests run 2-4 ranks.
export OMP_NUM_THREADS := 1
export MKL_NUM_THREADS := 1
export OPENBLAS_NUM_THREADS := 1
export HVDLITE_BUILD_JOBS ?= 2

# CUDA: nvcc on PATH or in /usr/local/cuda, unless HVDLITE_WITH_CUDA=0. The stamp's name records
# the answer, so a machine that gains nvcc later installs the NCCL wheel then.
NVCC := $(if $(filter 0,$(HVDLITE_WITH_CUDA)),,$(firstword $(shell command -v nvcc 2>/dev/null) \
          $(wildcard /usr/local/cuda/bin/nvcc)))
CUDA_STAMP := $(VENV)/.cuda-stamp-$(if $(NVCC),yes,no)
ifneq ($(NVCC),)
export CUDACXX ?= $(NVCC)
endif

.PHONY: install apt build demo test test-all docs lint format bench horovod horovod-suite gpu-check clean distclean install-horovod-compat \
	uninstall-horovod-compat

install: build

# Installs only the packages dpkg does not report as installed; apt-get update runs once, first.
apt:
	@missing=""; \
	for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "apt-get install:$$missing"; \
	  $(SUDO) apt-get update && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	fi

$(VPY): | apt
	$(PYTHON) -m venv $(VENV)

$(VENV)/.pip-stamp: requirements-dev.txt | $(VPY) apt
	$(VPY) -m pip install -r requirements-dev.txt
	touch $@

# tf-keras: Keras 2 for TensorFlow 2.16+, what tf.keras is under TF_USE_LEGACY_KERAS=1 (README,
# "Keras 2 scripts"), at TensorFlow's version. --no-deps: tf-keras declares a dependency on the
# `tensorflow` package while this project installs `tensorflow-cpu`; with its dependencies pip
# would install a second TensorFlow over the first.
$(VENV)/.tf-keras-stamp: requirements-dev.txt | $(VENV)/.pip-stamp
	$(VPY) -m pip install --no-deps "tf-keras==$$($(VPY) -c 'import importlib.metadata as m; print(m.version("tensorflow-cpu"))')"
	touch $@

# Lightning and what else needs torch (requirements-torch-nodeps.txt says why --no-deps).
$(VENV)/.torch-nodeps-stamp: requirements-torch-nodeps.txt | $(VENV)/.pip-stamp
	$(VPY) -m pip install --no-deps -r requirements-torch-nodeps.txt
	touch $@

$(CUDA_STAMP): requirements-cuda.txt | $(VENV)/.pip-stamp
	$(if $(NVCC),$(VPY) -m pip install -r requirements-cuda.txt,@echo "no nvcc: hvdlite builds without its NCCL module")
	touch $@

# First build of the core and registration of the package (console script hvdliterun included).
$(VENV)/.editable-stamp: setup.py pyproject.toml $(VENV)/.pip-stamp $(VENV)/.tf-keras-stamp $(VENV)/.torch-nodeps-stamp $(CUDA_STAMP) | apt
	env -u MAKEFLAGS -u MAKELEVEL $(VPY) -m pip install --no-build-isolation --no-deps -e .
	touch $@

# Incremental rebuild: CMake in build/ recompiles only what changed, then the module is copied
# into hvdlite/. (MAKEFLAGS/MAKELEVEL are dropped so CMake's own make stays quiet.)
build: $(VENV)/.editable-stamp $(CUDA_STAMP) | apt
	env -u MAKEFLAGS -u MAKELEVEL $(VPY) setup.py -q build_ext --inplace

# Opt-in Horovod compatibility namespace (docs/horovod_compat.md): a regular (not editable) install
# of compat/, so rerun after editing compat/. compat/setup.py exits non-zero, and pip with it,
# when a real Horovod is installed in the venv.
install-horovod-compat: install
	env -u MAKEFLAGS -u MAKELEVEL $(VPY) -m pip install --no-build-isolation --no-deps ./compat

uninstall-horovod-compat:
	$(VPY) -m pip uninstall -y hvdlite-horovod-compat

demo: install
	$(VENV)/bin/hvdliterun -np 2 $(VPY) examples/pytorch_digits.py

# pytest's exit code 5 (no test collected) fails the target like any other non-zero code.
# `make test` skips the tests marked slow (multi-host, elastic, 3-8 rank equivalence runs) unless
# CI is set, as CI sets it: CI runs everything. `make test-all` runs everything anywhere.
TEST_MARKS := $(if $(CI),,-m "not slow")
# --durations=10 prints the ten slowest tests at the end: the first place to look when the suite
# grows slower (the default suite's budget is 5 minutes on a 2-core machine).
test: install
	$(VPY) -m pytest -q tests $(TEST_MARKS) --durations=10 $(PYTEST_ARGS)

test-all: install
	$(VPY) -m pytest -q tests $(PYTEST_ARGS)

# Horovod's own test files run unchanged against hvdlite (tests/horovod_suite.py --help).
SUITE ?= test_tensorflow.py
horovod-suite: install
	$(VPY) tests/horovod_suite.py $(SUITE) $(HOROVOD_SUITE_ARGS)

gpu-check:
	bash tests/gpu_check.sh

# Static checks; the tools are pinned in requirements-dev.txt, configured in pyproject.toml (ruff),
# mypy.ini and .clang-format. Needs only the venv, not a build of the core.
PY_LINT_DIRS := hvdlite tests benchmarks examples compat $(wildcard docs/*.py)
CXX_SOURCES = $(shell git ls-files 'csrc/*.cc' 'csrc/*.h' 'csrc/*.cu' 'tests/cpp/*.cc' 'tests/cpp/*.h')
lint: $(VENV)/.pip-stamp
	$(VENV)/bin/ruff check $(PY_LINT_DIRS)
	$(VENV)/bin/ruff format --check $(PY_LINT_DIRS)
	$(VENV)/bin/mypy
	@echo clang-format --dry-run -Werror '<csrc/ and tests/cpp/ sources>'
	@$(VENV)/bin/clang-format --dry-run -Werror $(CXX_SOURCES)

format: $(VENV)/.pip-stamp
	$(VENV)/bin/ruff check --fix $(PY_LINT_DIRS)
	$(VENV)/bin/ruff format $(PY_LINT_DIRS)
	$(VENV)/bin/clang-format -i $(CXX_SOURCES)

# Cached after the first build (about 6 minutes on 2 cores), failures too: the benchmarks then
# skip Horovod and print why; `benchmarks/_horovod_env.sh --retry` builds again.
horovod: install
	-PYTHON=$(PYTHON) benchmarks/_horovod_env.sh

bench: install horovod
	$(VPY) benchmarks/_suite.py $(if $(filter 1,$(BENCH_FULL)),--full)

# A fresh build each time (-E): Sphinx reports a page's warnings only when it reads the page.
docs: install
	$(VPY) -m sphinx -E -W --keep-going -q -b html docs docs/_build/html
	$(VPY) docs/check_links.py docs/_build/html

clean:
	rm -rf build hvdlite/_core*.so hvdlite.egg-info .pytest_cache docs/_build docs/api
	rm -f $(VENV)/.editable-stamp

distclean: clean
	rm -rf $(VENV)
