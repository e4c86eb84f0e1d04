# The README's two set-up commands: `make run` and `make test`. Both build the venv from nothing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test lint venv clean

venv: $(STAMP)

# Install the jointly resolved lock in one pip call (see DEVELOPERS.md: installing the
# packages one by one lands on a broken protobuf set), then the project itself without deps.
$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -m pip check
	touch $(STAMP)

run: $(STAMP)
	$(PY) app.py plan --brief examples/briefs/local-smoke.yaml --out out/local-smoke --json out/local-smoke/plan.json

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy agents graphs tools app.py

clean:
	rm -rf $(VENV) out .trainwright .pytest_cache
