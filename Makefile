# The README's two set-up commands: `make run` and `make test`. Both build the venv from nothing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# TensorFlow (tools/smoke/scripts/tf_train.py) in a venv of its own: its protobuf and numpy pins clash
# with requirements.lock's.
TF_VENV  := .venv-tf
TF_STAMP := $(TF_VENV)/.installed
# Written once SLURM's and munge's programs are all installed (make slurm).
SLURM_STAMP := $(VENV)/.slurm-installed
SLURM_PROGRAMS := munged slurmctld slurmd sbatch sinfo scancel scontrol

.PHONY: run test test-fast lint venv tf-venv clean browser slurm

venv: $(STAMP)

# Install the jointly resolved lock in one pip call (see DEVELOPERS.md: installing the
# packages one by one lands on a broken protobuf set), then the project itself without deps.
$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -m pip check
	touch $(STAMP)

tf-venv: $(TF_STAMP)

# The same way as the main venv: one pip call from the fully pinned lock, then pip check.
$(TF_STAMP): requirements-tf.lock
	test -x $(TF_VENV)/bin/python || $(PYTHON) -m venv $(TF_VENV)
	$(TF_VENV)/bin/python -m pip install --quiet -r requirements-tf.lock
	$(TF_VENV)/bin/python -m pip check
	touch $(TF_STAMP)

run: $(STAMP)
	$(PY) app.py plan --brief examples/briefs/local-smoke.yaml --out out/local-smoke --json out/local-smoke/plan.json

# Every tier (tests/unit, graph, e2e, smoke), slow-marked real runs included. The unit, graph and
# e2e tiers run in two pytest-xdist workers that steal each other's queued tests: most of their
# tests keep one core busy (the graph in process, or one CLI process), so two fill a 2-core
# machine. The smoke tier runs in one: each real run starts two ranks, one per core. (Two smoke
# workers ran the tier in 648 s instead of 834 s, but starved timed tests: prepare_data.py's
# 300 s guard and the TF workers' supervisor watch failed in one of three CI runs.)
test: $(STAMP) $(TF_STAMP) browser slurm
	$(PY) -m pytest -q -n 2 --dist worksteal --durations=25 tests/unit tests/graph tests/e2e
	$(PY) -m pytest -q --durations=25 tests/smoke

# The fast tiers: tests/unit (pure, no process, each test under 2 s of CPU, enforced) and
# tests/graph (the graph in process), without the slow-marked tests. Needs only .venv.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" --durations=10 tests/unit tests/graph

# Benchmarks (bench/run.py; bench/README.md lists every script): both write a dated report,
# bench/results/<YYYY-MM-DD>-suite-quick|full.md and .json. bench-quick runs fewer cases and
# repeats (under 5 minutes on a quiet 2-core machine); bench runs more of each, roughly 10-20
# minutes.
.PHONY: bench bench-quick
bench: $(STAMP)
	$(PY) bench/run.py --full

bench-quick: $(STAMP)
	$(PY) bench/run.py --quick

# Headless Chromium for tests/e2e/test_batch.py's browser check (Debian's package). Installs only
# as root; otherwise it says so, and the test fails under CI=true rather than passing silently.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
	  else echo "make browser: chromium missing and not root (or no apt-get); the browser test will not run" >&2; fi

# SLURM and munge for tests/smoke/test_slurm.py, which starts a one-node cluster of its own
# (Debian's slurm-wlm: slurmctld, slurmd and the client commands; munge for their
# authentication). Installs only as root; otherwise it says so, and the test fails under CI=true.
# The test writes its own slurm.conf and munge key under its temp folder and starts the daemons
# itself: the packages' system services are neither configured nor needed.
slurm: $(SLURM_STAMP)

$(SLURM_STAMP):
	@missing=0; for p in $(SLURM_PROGRAMS); do command -v $$p >/dev/null || missing=1; done; \
	  if [ $$missing = 1 ]; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	        --no-install-recommends slurm-wlm munge >/dev/null; \
	    else echo "make slurm: slurm-wlm/munge missing and not root (or no apt-get); the SLURM test will not run" >&2; fi; \
	  fi
	@for p in $(SLURM_PROGRAMS); do command -v $$p >/dev/null || exit 0; done; mkdir -p $(VENV) && touch $@

# The LangGraph dev server (langgraph-cli[inmem], in the lock) serving graphs.serve:graph as the
# assistant `trainwright` on http://127.0.0.1:2024, offline: no browser, no CLI analytics, no
# version check. More flags: make serve SERVE_ARGS="--port 8123 --no-reload".
.PHONY: serve
serve: $(STAMP)
	LANGGRAPH_CLI_NO_ANALYTICS=1 LANGGRAPH_NO_VERSION_CHECK=true \
	  $(VENV)/bin/langgraph dev --no-browser --config langgraph.json $(SERVE_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy agents graphs tools app.py

clean:
	rm -rf $(VENV) $(TF_VENV) out .trainwright .pytest_cache
