PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test lint bench clean

install: $(STAMP)

# Reinstall only when the project metadata changes; the project is installed
# editable, so source edits need no reinstall.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $(STAMP)

run: install
	$(BIN)/boxqueue serve --config conf/boxqueue.toml

test: install
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .

bench: install
	$(BIN)/python bench/iproto_load.py

clean:
	rm -rf $(VENV) build *.egg-info
