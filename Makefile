PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

NODE_STAMP := $(VENV)/node/.installed

.PHONY: install run test lint bench clean

install: $(STAMP) $(NODE_STAMP)

# Reinstall only when the project metadata changes; the project is installed
# editable, so source edits need no reinstall.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,pipeline]'
	@touch $(STAMP)

# The Node connector, for its compatibility test; skipped quietly where npm is missing.
$(NODE_STAMP): $(STAMP)
	@if command -v npm >/dev/null 2>&1; then \
		timeout 300 npm install --silent --no-audit --no-fund --prefix $(VENV)/node tarantool-driver@3.1.0 \
		&& touch $(NODE_STAMP) || echo "npm install failed: the Node connector test will be skipped"; \
	else echo "npm not found: the Node connector test will be skipped"; fi

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
