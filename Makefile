# Two commands do all the set-up on a fresh machine:
#   make run   - build everything on the embedded defaults (Dagster job) and print where reports are
#   make test  - run the test suite
VENV ?= .venv
# Extras installed by the set-up: all (every backend but torch's, pg, cli, reports, dagster, ui),
# dev, and postgres (Dagster storage in PostgreSQL: dagster.production.yaml). CI then tests the
# sentence-transformers backend (torch) too: test-sentence-transformers. The core alone
# (`pip install .`) is what an agent service needs.
EXTRAS ?= dev,all,postgres
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test test-sentence-transformers ui bench lint faults lock

setup: $(STAMP)

# torch: constraints.txt pins the CPU build that lies in the local wheel folder.
$(STAMP): pyproject.toml constraints.txt requirements.lock
	@echo "installing .[$(EXTRAS)] into $(VENV) (quietly: 1-2 min with a warm pip cache)"
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -U pip
	$(VENV)/bin/pip install -q -c constraints.txt -c requirements.lock -e '.[$(EXTRAS)]'
	touch $(STAMP)

run: setup
	$(PY) -m rag_assets.run

test: setup
	$(VENV)/bin/pytest -q -p no:cacheprovider

# The tests of the sentence-transformers backend (torch), which the set-up leaves out; CI runs them.
test-sentence-transformers: setup
	$(VENV)/bin/pip install -q -c constraints.txt -c requirements.lock -e '.[sentence-transformers]'
	$(VENV)/bin/pytest -q -p no:cacheprovider -m sentence_transformers

# dagster dev on the local instance; stops on Ctrl-C and on SIGTERM, also in the background.
ui: setup
	$(PY) -m rag_assets.ui -w workspace.yaml

bench: setup
	$(PY) -m bench.run
	$(PY) -m bench.kb_scale $(KB_SCALE_ARGS)
	$(PY) -m bench.messy_kb
	$(PY) -m bench.serving_latency
	$(PY) -m bench.serving_load
	$(PY) -m bench.dagster_embed

# What CI checks before the tests (.ci/run): lint, format and types, on the tool versions pinned in
# the dev extra.
LINTED := rag_core rag_assets tests bench scripts
lint: setup
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/mypy rag_core

# Fault injection on the runbook corpus (issue 12): one line per fault, exit 1 on any FAIL.
faults: setup
	$(PY) -m bench.faults

# requirements.lock pins every package of every extra (the versions CI tested); the set-up installs
# within it. Refresh after changing dependencies: `make lock` (newest allowed: UPGRADE=--upgrade).
lock: setup
	$(VENV)/bin/uv pip compile pyproject.toml --all-extras -c constraints.txt $(UPGRADE) \
		--python-version 3.11 --no-header --annotation-style line -o requirements.lock
