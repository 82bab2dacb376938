"""Runs of the fault suite: a replica set in namespaces, every workload, nemeses one at a time,
then the checkers. ``python -m tests.faults.runner`` (``make faults``) is the long form.

A run (:func:`execute`) starts a fresh topology and cluster, sets the workloads up, starts their
clients, and for each nemesis of its :class:`Plan`: injects it, holds it a few seconds, heals
it, restarts any process that died, waits for an acknowledged write (the set is live again) and
a quiet period. Then it stops the clients, heals everything, reads the final state (each
workload's final reads, every member's data once they agree) and runs the checkers. The seed
decides the order of the nemeses and their choices; it is printed first, so that a run can be
repeated.

Environment of the long form: ``FAULTS_RUNS`` (default 20), ``FAULTS_SEED`` (the first run's
seed; default random; run i uses seed + i), ``FAULTS_CONTROL`` (a negative-control run after
every N runs; default 5, 0 for none), ``FAULTS_UNSAFE`` (the control's ``BOXQUEUE_UNSAFE``, default
``no-quorum``), ``FAULTS_DIR`` (where runs keep their logs and histories).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults import checkers, nemeses
from tests.faults.checkers import Verdict
from tests.faults.cluster import FaultCluster
from tests.faults.failover import Window, measure, percentile
from tests.faults.history import History
from tests.faults.netns import Topology
from tests.faults.workloads import Workload
from tests.faults.workloads.box_queue import BoxQueueCycle
from tests.faults.workloads.registers import Registers
from tests.faults.workloads.tarantool_queue import TarantoolQueueCycle
from tests.faults.workloads.unique_replaces import UniqueReplaces
from tests.faults.workloads.zaqar_messages import ZaqarMessages

SETTLE_TIMEOUT_S = 90.0  # after healing, an acknowledged write must come within this (liveness)
# BOXQUEUE_UNSAFE for the negative control (boxqueue/replication/safeguards.py): by default the
# leader confirms a write it alone holds (no-quorum); FAULTS_UNSAFE names another switch. (With
# no-fence alone, a deposed leader goes on leading, yet no acknowledged write was seen lost in
# runs of these nemeses: its followers move to the successor and stop acknowledging it, so its
# quorum stalls; the quorum is the safeguard whose loss the checkers must see.)
CONTROL_SWITCH = os.environ.get("FAULTS_UNSAFE", "no-quorum")
# The nemeses that expose a leader answering alone: it is cut off or killed with writes its
# followers never received.
CONTROL_NEMESES = ["isolate-leader", "kill-leader-and-successor", "leader-from-followers", "pause-leader"]

Say = Callable[[str], None]


def _say(text: str) -> None:
    print(text, flush=True)


@dataclass
class Plan:
    seed: int
    nemeses: list[str]
    etcd_size: int = 1
    unsafe: str | None = None
    hold_s: tuple[float, float] = (3.0, 5.0)
    quiet_s: float = 3.0
    warmup_s: float = 2.0

    @property
    def label(self) -> str:
        control = f", BOXQUEUE_UNSAFE={self.unsafe}" if self.unsafe else ""
        return f"seed {self.seed}, etcd x{self.etcd_size}{control}: {', '.join(self.nemeses)}"


@dataclass
class RunReport:
    plan: Plan
    verdicts: list[Verdict] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    workdir: Path | None = None
    seconds: float = 0.0
    error: str | None = None  # the run could not be carried out

    @property
    def violations(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.valid]

    @property
    def ok(self) -> bool:
        return self.error is None and not self.violations

    def text(self) -> str:
        lines = [f"== run ({self.plan.label}) in {self.seconds:.0f} s, kept in {self.workdir}"]
        for w in self.windows:
            fo = f"{w.failover_s:.2f} s" if w.failover_s is not None else "none"
            gap = f"{w.longest_gap_s:.2f} s" if w.longest_gap_s is not None else "-"
            lines.append(f"   failover after {w.nemesis}: {fo} (longest gap without an acknowledged write {gap})")
        failovers = [w.failover_s for w in self.windows if w.failover_s is not None]
        if failovers:
            lines.append(f"   failover over this run: p50 {percentile(failovers, 50):.2f} s, "
                         f"p99 {percentile(failovers, 99):.2f} s")
        lines += [f"   note: {n}" for n in self.notes]
        if self.error:
            lines.append(f"   RUN ERROR: {self.error}")
        lines += [v.report() for v in self.verdicts]
        return "\n".join(lines)


def workloads_for(seed: int) -> list[Workload]:
    return [UniqueReplaces(), BoxQueueCycle(), TarantoolQueueCycle(), ZaqarMessages(), Registers(seed=seed)]


def _revive(cluster: FaultCluster, during: str) -> list[str]:
    """Starts every process that is not running (a nemesis killed it, or it died); says which
    died on its own."""
    notes = []
    for name, etcd in cluster.etcds.items():
        etcd.resume()
        if not etcd.running():
            if etcd.proc is not None:
                notes.append(f"etcd {name} exited ({etcd.proc.returncode}) during {during}")
            etcd.start()
    for name, member in cluster.members.items():
        member.resume()
        if not member.running():
            if member.proc is not None:
                notes.append(f"{name} exited with code {member.proc.returncode} during {during}; "
                             f"its last lines: {member.log(600)!r}")
            member.start()
    return notes


def _wait_for_a_write(history: History, since: float, timeout: float) -> float | None:
    """When the first write invoked after ``since`` was acknowledged, or None if none within
    ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [op.completed for op in list(history.ops)
                if op.acknowledged_write and op.invoked >= since and op.completed is not None]
        if done:
            return min(done)
        time.sleep(0.1)
    return None


def execute(plan: Plan, workdir: Path, say: Say = _say) -> RunReport:
    report = RunReport(plan, workdir=workdir)
    started = time.monotonic()
    rng = random.Random(plan.seed)
    say(f"== run: {plan.label}")
    topology = Topology(FaultCluster.host_names(plan.etcd_size))
    cluster = FaultCluster(topology, workdir, etcd_size=plan.etcd_size, unsafe=plan.unsafe)
    history = History()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    live: list[str] = []  # liveness: nemeses after which no write was acknowledged in time
    try:
        cluster.start()
        workloads = workloads_for(plan.seed)
        for w in workloads:
            w.setup(cluster)
        def client(w: Workload, i: int) -> None:
            try:
                w.client(i, history, cluster, stop)
            except Exception as exc:  # a client that dies stops recording: say so
                report.notes.append(f"client {w.name}-{i} died: {exc!r}")

        for w in workloads:
            for i in range(w.clients):
                t = threading.Thread(target=client, args=(w, i), name=f"{w.name}-{i}", daemon=True)
                t.start()
                threads.append(t)
        time.sleep(plan.warmup_s)
        for name in plan.nemeses:
            nemesis = nemeses.ALL[name]()
            stage = nemeses.Stage(cluster, topology, rng, rng.uniform(*plan.hold_s))
            try:
                what = nemesis.inject(stage)
            except Exception as exc:
                what = f"could not be injected: {exc!r}"
                report.notes.append(f"{name} {what}")
            effective = nemesis.effective_at or time.monotonic()
            history.nemesis("start", {"nemesis": name, "what": what})
            hold = nemesis.hold_s if nemesis.hold_s is not None else stage.hold_s
            say(f"   {name}: {what}; held {hold:.1f} s")
            time.sleep(max(0.0, hold - (time.monotonic() - effective)))
            healed = time.monotonic()
            nemesis.heal(stage)
            topology.heal()
            report.notes += _revive(cluster, name)
            history.nemesis("heal", {"nemesis": name})
            if _wait_for_a_write(history, healed, SETTLE_TIMEOUT_S) is None:
                live.append(name)
                report.notes.append(f"no write acknowledged within {SETTLE_TIMEOUT_S:.0f} s of healing {name}")
            time.sleep(plan.quiet_s)
            report.windows.append(Window(name, effective, time.monotonic()))
        stop.set()
        for t in threads:
            t.join(60)
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            report.notes.append(f"clients still running a minute after the stop: {stuck}")
        topology.heal()
        report.notes += _revive(cluster, "the final healing")
        for w in workloads:
            w.finish(history, cluster)
        history.close_pending()
        measure(history.ops, report.windows)
        data, note = cluster.converge()
        if note:
            report.notes.append(f"final state: {note}")
        for w in workloads:
            report.verdicts += w.check(history, data)
        report.verdicts.append(checkers.members_equal(data, cluster.members))
        report.verdicts.append(Verdict("liveness after healing", not live, {"nemeses": len(plan.nemeses)},
                                       [checkers.Finding(f"no write acknowledged within {SETTLE_TIMEOUT_S:.0f} s "
                                                         f"of healing {n}") for n in live]))
    except Exception:
        report.error = traceback.format_exc()
        stop.set()
    finally:
        stop.set()
        try:
            history.close_pending()
            history.dump(workdir / "history.jsonl")
        finally:
            try:
                cluster.stop()
            finally:
                topology.close()
    report.seconds = time.monotonic() - started
    say(report.text())
    return report


def long_plans(seed: int) -> list[Plan]:
    """Every nemesis once, in the seed's order: those that need three etcd members in a run of
    their own (with a leader isolated too, so that an election happens against them)."""
    rng = random.Random(seed)
    one = [n for n, cls in nemeses.ALL.items() if not cls.needs_etcd3]
    three = [n for n, cls in nemeses.ALL.items() if cls.needs_etcd3] + ["isolate-leader"]
    rng.shuffle(one)
    rng.shuffle(three)
    return [Plan(seed, one, etcd_size=1), Plan(seed, three, etcd_size=3)]


def short_plan(seed: int, count: int = 4) -> Plan:
    """``count`` nemeses chosen by the seed; three etcd members when one of them needs it."""
    rng = random.Random(seed)
    chosen = rng.sample(sorted(nemeses.ALL), count)
    etcd = 3 if any(nemeses.ALL[n].needs_etcd3 for n in chosen) else 1
    return Plan(seed, chosen, etcd_size=etcd, hold_s=(2.5, 3.5), quiet_s=2.0, warmup_s=1.5)


def control_plan(seed: int) -> Plan:
    return Plan(seed, list(CONTROL_NEMESES), unsafe=CONTROL_SWITCH)


def summary(reports: list[RunReport]) -> str:
    failovers = [w.failover_s for r in reports for w in r.windows if w.failover_s is not None]
    gaps = [w.longest_gap_s for r in reports for w in r.windows if w.longest_gap_s is not None]
    normal = [r for r in reports if not r.plan.unsafe]
    controls = [r for r in reports if r.plan.unsafe]
    lines = [f"== {len(normal)} runs, {sum(1 for r in normal if not r.ok)} with violations or errors; "
             f"{len(controls)} negative controls, {sum(1 for r in controls if r.violations)} caught"]
    for r in reports:
        state = "ok" if r.ok else ("ERROR" if r.error else "VIOLATIONS: " + ", ".join(v.checker for v in r.violations))
        lines.append(f"   {r.plan.label} -> {state}")
    lines.append(f"   failover p50 {percentile(failovers, 50):.2f} s, p99 {percentile(failovers, 99):.2f} s "
                 f"over {len(failovers)} nemeses; longest gap p50 {percentile(gaps, 50):.2f} s, "
                 f"p99 {percentile(gaps, 99):.2f} s")
    return "\n".join(lines)


def main() -> int:
    from tests.faults.netns import unavailable_reason

    # No arguments, only the environment above: --help says so rather than starting the suite.
    argparse.ArgumentParser(prog="python -m tests.faults.runner", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

    why = unavailable_reason()
    if why:
        print(f"fault suite skipped: {why}")
        return 0
    runs = int(os.environ.get("FAULTS_RUNS", "20"))
    base = int(os.environ.get("FAULTS_SEED", str(random.SystemRandom().randrange(10**6))))
    control_every = int(os.environ.get("FAULTS_CONTROL", "5"))
    root = Path(os.environ.get("FAULTS_DIR") or tempfile.mkdtemp(prefix="boxqueue-faults-"))
    print(f"fault suite: {runs} runs from seed {base} (FAULTS_SEED={base}), kept in {root}", flush=True)
    reports: list[RunReport] = []
    for i in range(runs):
        seed = base + i
        for j, plan in enumerate(long_plans(seed)):
            reports.append(execute(plan, root / f"run-{seed}-{j}"))
        if control_every and (i + 1) % control_every == 0:
            reports.append(execute(control_plan(seed), root / f"control-{seed}"))
    print(summary(reports), flush=True)
    normal_ok = all(r.ok for r in reports if not r.plan.unsafe)
    controls_caught = all(r.violations for r in reports if r.plan.unsafe)
    return 0 if normal_ok and controls_caught else 1


if __name__ == "__main__":
    sys.exit(main())
