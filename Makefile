# Two commands from a fresh clone: `make demo` and `make test`.
# Both create .venv and install the project with constraints.txt, which pins the local CPU build of
# torch (an unpinned torch would pull gigabytes of CUDA packages).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_OUT ?= nccl-doctor-out/demo

.PHONY: demo test test-all install tools bench readme-table cli-docs clean

# The project, then the functional collectives' C++ kernel against the torch just installed
# (setup.py: pip's isolated build has no torch to build it with). Optional, as the C ring is:
# where it cannot be built (no C++ compiler) the Python kernel records the same calls, slower.
# About 20 s of compiling on the 2-core VM; never built at run time.
# The build says nothing: a warning of setuptools about this project (a deprecated setting, a
# directory of data not declared as a package) fails the install, before a later setuptools
# makes it an error (another package's warning - a compiler's, torch's about ninja - is
# only printed). The project is installed a second time, alone (4 s), for its own build's
# words: the first install's are mixed with its dependencies'. Setuptools' one note that an
# editable install is editable is no warning about the project. tests/unit/test_packaging.py is
# the quick twin of this check.
BUILD_LOG := $(VENV)/build.log
$(STAMP): pyproject.toml setup.py constraints.txt nccl_doctor/capture/_ring.c nccl_doctor/supervisor/_senders.c \
		nccl_doctor/rank/recorder/_functional_kernel.cpp
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	$(BIN)/python -m pip install --quiet --no-deps -e . 2>$(BUILD_LOG) \
		|| { cat $(BUILD_LOG) >&2; exit 1; }
	$(BIN)/python setup.py --quiet build_ext --inplace 2>>$(BUILD_LOG) \
		|| { cat $(BUILD_LOG) >&2; exit 1; }
	@if grep -E '(setuptools/[^ ]*: [A-Za-z_]*|Setuptools[A-Za-z]*)Warning: ' $(BUILD_LOG) \
	    | grep -qv 'Warning: Editable installation'; then \
	  cat $(BUILD_LOG) >&2; \
	  echo "make install: the build warned (above): fix pyproject.toml or setup.py" >&2; exit 1; \
	fi
	touch $(STAMP)

install: $(STAMP)

# The reproducer a newcomer should see first (BUGS.md A: CPO gathers per-rank-padded logits and
# hangs), run under the doctor, which diagnoses the hang and stops the job. It hangs on purpose,
# so its exit status (124) is not make's: the diagnosis is what this target shows.
demo: $(STAMP)
	@$(COMPILE)
	-$(BIN)/nccl-doctor demo --force --out $(DEMO_OUT)
	@echo "Replay it any time with: $(BIN)/nccl-doctor replay $(DEMO_OUT)"
	@echo "The other reproducers: $(BIN)/nccl-doctor demo --list"
	@echo "The report as a page (open it in a browser): $(DEMO_OUT)/report.html"

# pytest-xdist workers taking tests one by one (the suite is mostly real multi-process jobs;
# their ranks are forked by a fork server that imported torch once: nccl_doctor/testing/zygote.py);
# the files whose tests share one real job stay on one worker, so that the job runs once
# (tests/conftest.py SHARED). The default tier's jobs mostly wait (for a hang to be called, a
# straggler to be sampled): four workers overlap those waits on two cores (6 min 1 s on
# 2026-11-28, against 6 min 22 s with three, the same tests). Every tier keeps two: its heavy
# jobs (8-rank meshes, DeepSpeed, Ray) need the memory and the cores. TEST_WORKERS=0 runs it in
# one process.
TEST_WORKERS ?= 4
ALL_WORKERS ?= 2
PYTEST = $(BIN)/python -m pytest -rs --durations=30 --dist loadgroup
# Bytecode for the package, written once (every rank, supervisor and test process imports it;
# where PYTHONDONTWRITEBYTECODE is set, each would compile ~150 modules again, 0.1-0.3 s a process)
COMPILE := $(BIN)/python -m compileall -q nccl_doctor plugins reproducers >/dev/null

# The tools the heavy tiers drive for real, as command:Debian package pairs, installed when the
# command is missing (as root with apt-get, as on CI); elsewhere it says what to install.
# Prometheus and Chromium: the servers tests/e2e/test_serve.py scrapes and loads its page in
# (the serve tier); Slurm and MUNGE: the private 2-node cluster of tests/upstream/slurm_cluster.py
# (the slurm tier).
TOOLS := prometheus:prometheus chromium:chromium slurmctld:slurmctld slurmd:slurmd \
	srun:slurm-client munged:munge

tools:
	@PATH="$$PATH:/usr/sbin:/sbin"; missing=""; for t in $(TOOLS); do \
	  command -v $${t%%:*} >/dev/null 2>&1 || missing="$$missing $${t#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q $$missing >/dev/null || \
	      { apt-get update -q >/dev/null && apt-get install -y -q $$missing >/dev/null; }; \
	  else \
	    echo "make test-all: install the Debian packages$$missing (tests/e2e/test_serve.py," \
	      "tests/upstream/test_slurm_cluster.py)" >&2; \
	  fi; \
	fi

# The default tier (tests/conftest.py TIERS): the unit tests first, the core real gloo jobs,
# replay, the CLI, the docs, the pytest plugin, the faults; the other tiers are deselected.
test: $(STAMP)
	@$(COMPILE)
	$(PYTEST) -n $(TEST_WORKERS)

# Every tier: the default one, upstream (TRL), frameworks (Lightning, Accelerate, Trainer,
# DeepSpeed), ray, slurm, serve (Prometheus, Chromium), demos, meshes, compile, plugin, nodes,
# soak and fuzz. CI
# runs it.
test-all: $(STAMP) tools
	@$(COMPILE)
	$(PYTEST) -n $(ALL_WORKERS) --tier all

bench: $(STAMP)
	$(BIN)/python benchmarks/recorder_overhead.py
	$(BIN)/python benchmarks/fork_start.py

# the README's performance table, from the figures benchmarks recorded (docs/benchmarks/results.txt)
readme-table: $(STAMP)
	$(BIN)/python benchmarks/readme_table.py

# the command line's words from its parser: docs/cli.md and the synopses README.md and docs/
# show (tests/unit/test_cli_reference.py fails when they drift)
cli-docs: $(STAMP)
	$(BIN)/python docs/cli_reference.py

clean:
	rm -rf $(VENV) nccl-doctor-out .pytest_cache build nccl_doctor/capture/_ring*.so \
		nccl_doctor/rank/recorder/_functional_kernel*.so nccl_doctor/supervisor/_senders*.so
