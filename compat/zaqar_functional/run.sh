#!/bin/sh
# Zaqar 21.0.3's own v1.1 functional suite against a boxqueue Zaqar facade (spec section 2).
# Usage: compat/zaqar_functional/run.sh [port]   (a server with [zaqar] listen on that port must run;
# a fresh data directory, since the suite expects empty queues). Installs zaqar into .venv-zaqar once.
set -e
here=$(cd "$(dirname "$0")" && pwd)
port=${1:-8888}
venv=${ZAQAR_VENV:-$here/../../.venv-zaqar}
# (bench/real_zaqar.sh shares the venv and installs zaqar without the test tools: check for both.)
if ! "$venv/bin/python" -c 'import zaqar, pytest, ddt, testtools, fixtures' 2>/dev/null; then
    [ -x "$venv/bin/python" ] || python3.11 -m venv "$venv"
    "$venv/bin/pip" install -q 'zaqar==21.0.3' redis pymongo pytest ddt testtools fixtures
fi
cfg=$(mktemp -d)
cp "$here/conftest.py" "$cfg/"
cp "$("$venv/bin/python" -c 'import zaqar, os; print(os.path.dirname(zaqar.__file__))')/tests/etc/policy.yaml" "$cfg/"
sed "s/@PORT@/$port/" "$here/functional-tests.conf.in" > "$cfg/functional-tests.conf"
cp "$here/functional-zaqar.conf" "$cfg/"
cd "$cfg"
ZAQAR_TEST_INTEGRATION=1 ZAQAR_TESTS_CONFIGS_DIR="$cfg" "$venv/bin/python" -m pytest -p conftest -q \
    --pyargs zaqar.tests.functional.wsgi.v1_1 zaqar.tests.functional.wsgi.test_versions \
    -k "not TestHealth and not TestPools"
