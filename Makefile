# Two commands on a fresh machine:
#   make run    the main job (EfficientNet-Lite0 end to end on real photos)
#   make test   the test suite
# Both create the virtual environment first: torch is pinned and installed
# before anything that depends on it (a CPU build of torch 2.13.0 lies on disk).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.npuforge-installed

.PHONY: run test venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[weights,demo,test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/npuforge demo

test: $(STAMP)
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
