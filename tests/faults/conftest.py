"""The fault suite under pytest: skipped with the reason where this machine cannot run it (not
root, no ``ip netns``), marked ``faults``, and its failover figures printed at the end."""

from __future__ import annotations

import pytest

from tests.faults.failover import percentile
from tests.faults.netns import unavailable_reason
from tests.faults.runner import RunReport

REPORTS: list[RunReport] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "faults: the fault-injection suite (root, network namespaces)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    why = unavailable_reason()
    if why is None:
        return
    for item in items:
        if item.get_closest_marker("faults"):
            item.add_marker(pytest.mark.skip(reason=f"fault suite skipped: {why}"))


@pytest.fixture
def fault_reports() -> list[RunReport]:
    return REPORTS


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not REPORTS:
        return
    terminalreporter.section("fault suite: failover after each nemesis")
    failovers = []
    for report in REPORTS:
        for w in report.windows:
            fo = f"{w.failover_s:.2f} s" if w.failover_s is not None else "none"
            terminalreporter.write_line(f"seed {report.plan.seed}: {w.nemesis}: failover {fo}, "
                                        f"longest gap {w.longest_gap_s:.2f} s")
            if w.failover_s is not None:
                failovers.append(w.failover_s)
    terminalreporter.write_line(f"failover p50 {percentile(failovers, 50):.2f} s, p99 {percentile(failovers, 99):.2f} s "
                                f"over {len(failovers)} nemeses")
