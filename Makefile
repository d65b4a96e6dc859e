# Two commands from a fresh clone: `make demo` and `make test`.
# Both create .venv and install the project with constraints.txt, which pins the local CPU build of
# torch (an unpinned torch would pull gigabytes of CUDA packages).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_OUT ?= nccl-doctor-out/demo

.PHONY: demo test test-all install tools bench clean

$(STAMP): pyproject.toml setup.py constraints.txt nccl_doctor/capture/_ring.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The reproducer a newcomer should see first (BUGS.md A: CPO gathers per-rank-padded logits and
# hangs), run under the doctor, which diagnoses the hang and stops the job. It hangs on purpose,
# so its exit status (124) is not make's: the diagnosis is what this target shows.
demo: $(STAMP)
	-$(BIN)/nccl-doctor demo --force --out $(DEMO_OUT)
	@echo "Replay it any time with: $(BIN)/nccl-doctor replay $(DEMO_OUT)"
	@echo "The other reproducers: $(BIN)/nccl-doctor demo --list"
	@echo "The report as a page (open it in a browser): $(DEMO_OUT)/report.html"

# Two pytest-xdist workers taking tests one by one (the suite is mostly real multi-process jobs,
# each starting torch); the files whose tests share one real job stay on one worker, so that
# the job runs once (tests/conftest.py SHARED). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

# The tools the tests drive for real, as command:Debian package pairs, installed when the command
# is missing (as root with apt-get, as on CI); elsewhere it says what to install. Prometheus and
# Chromium: the servers tests/e2e/test_serve.py scrapes and loads its page in; Slurm and MUNGE: the
# private 2-node cluster of tests/upstream/slurm_cluster.py.
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
	    echo "make test: install the Debian packages$$missing (tests/e2e/test_serve.py," \
	      "tests/upstream/test_slurm_cluster.py)" >&2; \
	  fi; \
	fi

test: $(STAMP) tools
	$(BIN)/python -m pytest -q -rs --durations=30 -n $(TEST_WORKERS) --dist loadgroup

# make test and the heavy tiers it skips: the frameworks tier (tests/frameworks: real Lightning,
# Accelerate, transformers Trainer and DeepSpeed jobs in an environment of their own).
test-all: $(STAMP) tools
	NCCL_DOCTOR_FRAMEWORKS=1 $(BIN)/python -m pytest -q -rs --durations=30 -n $(TEST_WORKERS) \
	  --dist loadgroup

bench: $(STAMP)
	$(BIN)/python benchmarks/recorder_overhead.py

clean:
	rm -rf $(VENV) nccl-doctor-out .pytest_cache build nccl_doctor/capture/_ring*.so
