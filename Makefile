PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

NODE_STAMP := $(VENV)/node/.installed
GRPC_JS_STAMP := $(VENV)/node/.grpc-js-installed
NGHTTP2_STAMP := $(VENV)/.nghttp2-client
ZAQARCLIENT_STAMP := $(VENV)/zaqarclient/.installed
DECKARD_GEN := boxqueue/facades/deckard/generated
DECKARD_STAMP := $(DECKARD_GEN)/deckard_service_pb2_grpc.py

.PHONY: install build check-cc tarantool-package fault-tools run cluster test test-pure fuzz soak faults lint docs bench clean

install: check-cc $(STAMP) $(NODE_STAMP) $(GRPC_JS_STAMP) $(NGHTTP2_STAMP) $(ZAQARCLIENT_STAMP) $(DECKARD_STAMP) tarantool-package fault-tools build

# The request path is compiled with Cython (boxqueue/compiled.py lists the modules): a C compiler
# is a requirement of the supported machine.
check-cc:
	@command -v "$${CC:-cc}" >/dev/null 2>&1 || { \
		echo "boxqueue needs a C compiler to build its compiled request path, and '$${CC:-cc}' was not found."; \
		echo "Install one (Debian: apt-get install gcc) or set CC, then run make again."; \
		exit 1; }

# Recompile the extensions whose sources changed since the last build (the editable install
# builds them once; an edit to a compiled .py needs this before it takes effect).
build: $(STAMP)
	$(BIN)/python setup.py -q build_ext --inplace -j 2

# Reinstall only when the project metadata changes; the project is installed
# editable, so source edits need no reinstall.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,pipeline]'
	@touch $(STAMP)

# Deckard's proto, compiled by the pinned grpcio-tools into the facade's package (not committed:
# the generated code must match the installed grpcio/protobuf runtimes); setup.py does the same
# for a wheel built from a clean checkout.
$(DECKARD_STAMP): proto/deckard_service.proto proto/generate_deckard.py $(STAMP)
	$(BIN)/python proto/generate_deckard.py

# The Node connector, for its compatibility test; skipped quietly where npm is missing.
$(NODE_STAMP): $(STAMP)
	@if command -v npm >/dev/null 2>&1; then \
		timeout 300 npm install --silent --no-audit --no-fund --prefix $(VENV)/node tarantool-driver@3.1.0 \
		&& touch $(NODE_STAMP) || echo "npm install failed: the Node connector test will be skipped"; \
	else echo "npm not found: the Node connector test will be skipped"; fi

# Tarantool 2.6 (Debian's package): its net.box is a client in the connector tests, and its console,
# its tarantoolctl and the server itself are references for the console tests and the benchmarks.
# Installed with apt-get where that works (as root); elsewhere those tests are skipped, saying so.
tarantool-package:
	@command -v tarantool >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			export DEBIAN_FRONTEND=noninteractive; \
			{ timeout 600 apt-get install -y -q tarantool >/dev/null 2>&1 \
				|| { timeout 300 apt-get update -q >/dev/null && timeout 600 apt-get install -y -q tarantool >/dev/null; }; } \
			|| echo "apt-get could not install tarantool: the net.box and Tarantool console tests will be skipped"; \
		else echo "tarantool is not installed and apt-get cannot install it here (root needed): the net.box and Tarantool console tests will be skipped"; fi; }

# gRPC clients we did not write, for the front door's tests (tests/integration/test_independent_clients.py):
# Node's @grpc/grpc-js (with @grpc/proto-loader) from npm, and Debian's nghttp2-client (nghttp,
# h2load) through apt-get where it can run (as root); the tests say what they skip otherwise.
$(GRPC_JS_STAMP): $(STAMP)
	@if command -v npm >/dev/null 2>&1; then \
		timeout 300 npm install --silent --no-audit --no-fund --prefix $(VENV)/node @grpc/grpc-js@1.14.7 @grpc/proto-loader@0.8.1 \
		&& touch $(GRPC_JS_STAMP) || echo "npm install failed: the grpc-js tests will be skipped"; \
	else echo "npm not found: the grpc-js tests will be skipped"; fi

$(NGHTTP2_STAMP): $(STAMP)
	@if command -v nghttp >/dev/null 2>&1 && command -v h2load >/dev/null 2>&1; then touch $(NGHTTP2_STAMP); \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		{ timeout 600 apt-get install -y -q nghttp2-client >/dev/null 2>&1 \
		  || { timeout 600 apt-get update -q >/dev/null 2>&1 && timeout 600 apt-get install -y -q nghttp2-client >/dev/null 2>&1; }; } \
		&& touch $(NGHTTP2_STAMP) || echo "apt-get install nghttp2-client failed: the nghttp and h2load tests will be skipped"; \
	else echo "nghttp2-client is not installed and apt-get cannot run here: the nghttp and h2load tests will be skipped"; fi

# The fault suite's tools (tests/faults): nftables for partitions, iproute2 for namespaces and tc,
# from Debian's packages where apt-get can run (as root); the suite skips, saying why, elsewhere.
fault-tools:
	@command -v nft >/dev/null 2>&1 && command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			export DEBIAN_FRONTEND=noninteractive; \
			{ timeout 600 apt-get install -y -q nftables iproute2 >/dev/null 2>&1 \
				|| { timeout 300 apt-get update -q >/dev/null && timeout 600 apt-get install -y -q nftables iproute2 >/dev/null; }; } \
			|| echo "apt-get could not install nftables and iproute2: the fault suite will be skipped"; \
		else echo "nft, ip or tc missing and apt-get cannot install them here (root needed): the fault suite will be skipped"; fi; }

# python-zaqarclient 3.0.1 (the last with a v1.1 client), in a venv of its own (its OpenStack
# dependencies stay out of the project's), for the Zaqar token-auth test over TLS.
$(ZAQARCLIENT_STAMP): $(STAMP)
	$(BIN)/python -m venv $(VENV)/zaqarclient
	$(VENV)/zaqarclient/bin/python -m pip install -q python-zaqarclient==3.0.1
	@touch $(ZAQARCLIENT_STAMP)

run: install
	$(BIN)/boxqueue serve --config conf/boxqueue.toml

# etcd and a replica set of three on loopback (conf/cluster/), until Ctrl-C.
cluster: install
	conf/cluster/start.sh

test: install lint
	$(BIN)/python -m pytest
	$(MAKE) --no-print-directory test-pure

# The fuzz tests with 20 times the examples `make test` runs (about half an hour on 2 cores).
fuzz: install
	BOXQUEUE_FUZZ=long $(BIN)/python -m pytest -q tests/fuzz

# The soak with over two million requests of every API (about 5 minutes; `make test` runs a short one).
soak: install
	BOXQUEUE_SOAK=long $(BIN)/python -m pytest -q -s tests/soak

# The fault suite's long form (tests/faults/runner.py; `make test` runs a short one): FAULTS_RUNS
# runs (default 20) from seed FAULTS_SEED (default random, printed), every nemesis in each, a
# negative control every FAULTS_CONTROL runs (default 5). Needs root and `ip netns`.
faults: install
	$(BIN)/python -m tests.faults.runner

# The same sources uncompiled: they must still import and pass the unit tests.
test-pure: install
	BOXQUEUE_PURE=1 $(BIN)/python -m pytest -q tests/unit

# docs/configuration.md's reference, rewritten from the declarations in boxqueue/config_model.py.
docs: install
	$(BIN)/python -m boxqueue.config_reference docs/configuration.md

# ruff everywhere; mypy on the rooms listed in pyproject.toml's [tool.mypy] (CI runs this first).
lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: install
	$(BIN)/python bench/iproto_load.py

clean:
	rm -rf $(VENV) build *.egg-info $(DECKARD_GEN)/deckard_service_pb2*
	$(PYTHON) -c "import runpy; [print(m.replace('.', '/')) for m in runpy.run_path('boxqueue/compiled.py')['COMPILED_MODULES']]" \
		| while read m; do rm -f $$m.c $$m.*.so; done
