"""The fault suite's short form, run by ``make test``: a fixed seed and a random one (printed;
``FAULTS_SEED`` sets it), each a fresh replica set in network namespaces under every workload
and a few nemeses, then every checker; and the negative control, a run whose leader confirms what
it alone holds (``BOXQUEUE_UNSAFE=no-quorum``), which a checker must catch. ``make faults`` is the
long form (tests/faults/runner.py)."""

from __future__ import annotations

import os
import random

import pytest

from tests.faults.runner import control_plan, execute, short_plan

# kill -9 of the leader and its successor, the first etcd endpoint a minority, the leader cut from
# etcd, a disk filled
FIXED_SEED = 7
RANDOM_SEED = int(os.environ.get("FAULTS_SEED") or random.SystemRandom().randrange(10**6))


@pytest.mark.faults
@pytest.mark.filterwarnings("ignore::tarantool.error.ClusterDiscoveryWarning")  # no leader during elections
@pytest.mark.filterwarnings("ignore::tarantool.error.NetworkWarning")
@pytest.mark.parametrize("seed", [FIXED_SEED, RANDOM_SEED], ids=["fixed-seed", f"random-seed-{RANDOM_SEED}"])
def test_every_answer_holds_under_faults(seed, tmp_path, fault_reports):
    report = execute(short_plan(seed), tmp_path)
    fault_reports.append(report)
    if report.error is not None or report.violations:
        pytest.fail(report.text(), pytrace=False)


@pytest.mark.faults
@pytest.mark.filterwarnings("ignore::tarantool.error.ClusterDiscoveryWarning")
@pytest.mark.filterwarnings("ignore::tarantool.error.NetworkWarning")
def test_the_negative_control_is_caught(tmp_path, fault_reports):
    """The same suite against members started with a safeguard off: if no checker fires, the
    suite could not see the fault it exists for."""
    report = execute(control_plan(RANDOM_SEED), tmp_path)
    fault_reports.append(report)
    if report.error is not None:
        pytest.fail(report.text(), pytrace=False)
    assert report.violations, f"the negative control went unnoticed:\n{report.text()}"
