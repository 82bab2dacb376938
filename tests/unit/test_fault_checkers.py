"""The fault suite's checkers (tests/faults/checkers.py) on histories written by hand: each must
accept what the guarantees allow and find what they forbid, naming the operations involved."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys

import pytest

from tests.faults import checkers, linearizability
from tests.faults.failover import Window, measure, percentile
from tests.faults.history import Op

_index = itertools.count()
LOST = 0.1  # the share of simulated answers lost


def op(workload: str, f: str, value, start: float, end: float | None, outcome: str = "ok", result=None,
       process: str = "p") -> Op:
    o = Op(next(_index), process, workload, f, value, invoked=start, invoked_wall=start)
    o.type = outcome  # type: ignore[assignment]
    o.completed = end if end is not None else start + 100.0
    o.result = result
    return o


# -- unique writes --------------------------------------------------------------------------------


def kv(key: int, outcome: str, at: float = 0.0) -> Op:
    return op("kv", "replace", key, at, at + 0.1, outcome)


def test_unique_writes_accepts_what_the_promises_allow():
    ops = [kv(1, "ok"), kv(2, "fail"), kv(3, "info"), kv(4, "info")]
    final = {"n1": {1, 3}, "n2": {1, 3}, "n3": {1, 3}}
    verdict = checkers.unique_writes(ops, final)
    assert verdict.valid, verdict.report()
    assert verdict.counts["unknown kept"] == 1


def test_unique_writes_finds_an_acknowledged_write_lost_on_one_member():
    lost = kv(7, "ok")
    verdict = checkers.unique_writes([kv(1, "ok"), lost], {"n1": {1, 7}, "n2": {1}, "n3": {1, 7}})
    assert not verdict.valid
    (finding,) = verdict.findings
    assert finding.ops == [lost] and "lost" in finding.what and "n2" in finding.what
    assert "replace(7)" in verdict.report()


def test_unique_writes_finds_a_write_answered_failed_that_was_kept():
    failed = kv(9, "fail")
    verdict = checkers.unique_writes([failed], {"n1": {9}, "n2": {9}, "n3": set()})
    assert not verdict.valid
    assert verdict.findings[0].ops == [failed] and "failed" in verdict.findings[0].what
    assert verdict.counts["failed but kept"] == 1


# -- queues ----------------------------------------------------------------------------------------


def q(f: str, payload, start: float, end: float, outcome: str = "ok", result=None) -> Op:
    return op("box_queue", f, payload, start, end, outcome, result)


def take(payloads: list[str], start: float, end: float) -> Op:
    return q("take", None, start, end, result=payloads)


def test_queue_accepts_a_cycle_an_unacked_task_kept_and_an_unknown_ack():
    ops = [q("put", "a", 0, 1), take(["a"], 1, 2), q("ack", "a", 2, 3),
           q("put", "b", 3, 4), take(["b"], 4, 5),  # taken, never acked: still there
           q("put", "c", 5, 6), take(["c"], 6, 7), q("ack", "c", 7, 8, "info"),  # gone: the ack may have landed
           q("put", "d", 8, 9, "info"),  # unknown, not there
           take(["b"], 10, 11)]  # b again, its ack never acknowledged: allowed
    verdict = checkers.queue(ops, {"n1": {"b"}, "n2": {"b"}, "n3": {"b"}})
    assert verdict.valid, verdict.report()


def test_queue_finds_an_acknowledged_put_lost():
    put = q("put", "x", 0, 1)
    verdict = checkers.queue([put], {"n1": set(), "n2": set()})
    assert not verdict.valid
    assert verdict.findings[0].ops == [put] and "put lost" in verdict.findings[0].what


def test_queue_finds_a_task_gone_whose_only_ack_was_answered_failed():
    put, taken, ack = q("put", "x", 0, 1), take(["x"], 1, 2), q("ack", "x", 2, 3, "fail")
    verdict = checkers.queue([put, taken, ack], {"n1": set(), "n2": {"x"}})
    assert not verdict.valid
    (finding,) = verdict.findings
    assert finding.ops == [put, taken, ack]
    assert "answered 'failed'" in finding.what and "missing on n1" in finding.what


def test_queue_finds_a_task_delivered_again_after_its_ack_was_acknowledged():
    ack = q("ack", "x", 2, 3)
    again = take(["x"], 4, 5)
    concurrent = take(["x"], 2.5, 3.5)  # invoked before the ack was answered: no order between them
    verdict = checkers.queue([q("put", "x", 0, 1), take(["x"], 1, 2), ack, concurrent, again], {"n1": set()})
    assert not verdict.valid
    (finding,) = verdict.findings
    assert finding.ops == [ack, again] and "delivered again" in finding.what


def test_queue_finds_an_acknowledged_ack_s_task_still_held():
    ack = q("ack", "x", 2, 3)
    verdict = checkers.queue([q("put", "x", 0, 1), take(["x"], 1, 2), ack], {"n1": set(), "n2": {"x"}})
    assert not verdict.valid
    assert verdict.findings[0].ops == [ack] and "n2" in verdict.findings[0].what


@pytest.mark.parametrize("delivered, held", [(True, set()), (False, {"x"})])
def test_queue_finds_a_put_answered_failed_that_was_kept(delivered, held):
    put = q("put", "x", 0, 1, "fail")
    ops = [put] + ([take(["x"], 1, 2), q("ack", "x", 2, 3)] if delivered else [])
    verdict = checkers.queue(ops, {"n1": held})
    assert not verdict.valid
    assert verdict.findings[-1].ops[0] is put and "failed" in verdict.findings[-1].what


# -- registers -------------------------------------------------------------------------------------


def r(f: str, value, start: float, end: float | None, outcome: str = "ok", result=None, process: str = "p") -> Op:
    return op("register", f, value, start, end, outcome, result, process)


def test_registers_accept_a_sequential_history_and_concurrent_reads_either_way():
    ops = [r("read", 1, 0, 1, result=None), r("write", (1, 3), 1, 2), r("read", 1, 2, 3, result=3),
           r("cas", (1, 3, 4), 3, 4, result=True), r("cas", (1, 3, 0), 4, 5, result=False),
           r("read", 1, 5, 6, result=4),
           # a write and two reads overlapping it: one sees the old value, one the new
           r("write", (1, 2), 6, 9, process="a"), r("read", 1, 7, 8, result=4, process="b"),
           r("read", 1, 7.5, 8.5, result=2, process="c"), r("read", 1, 10, 11, result=2)]
    verdict = checkers.registers(ops)
    assert verdict.valid, verdict.report()


def test_registers_find_a_stale_read():
    stale = r("read", 1, 4, 5, result=1)
    verdict = checkers.registers([r("write", (1, 1), 0, 1), r("write", (1, 2), 2, 3), stale])
    assert not verdict.valid
    (finding,) = verdict.findings
    assert finding.ops[0] is stale and "not linearizable" in finding.what and "could hold 2" in finding.what


def test_registers_let_an_unknown_write_take_effect_late_or_never():
    unknown = r("write", (1, 3), 0, None, "info", process="a")
    later = [r("write", (1, 1), 1, 2), r("read", 1, 3, 4, result=1), r("read", 1, 10, 11, result=3)]
    assert checkers.registers([unknown, *later]).valid  # after the read of 1
    never = [r("write", (1, 1), 1, 2), r("read", 1, 3, 4, result=1), r("read", 1, 10, 11, result=1)]
    assert checkers.registers([unknown, *never]).valid
    before_its_call = [r("read", 1, -3, -2, result=3)]  # it cannot act before it was called
    assert not checkers.registers([unknown, *before_its_call]).valid


def test_registers_find_a_write_answered_failed_that_took_effect():
    failed = r("write", (2, 4), 0, 1, "fail")
    seen = r("read", 2, 2, 3, result=4)
    verdict = checkers.registers([r("write", (2, 1), -2, -1), failed, seen])
    assert not verdict.valid
    assert verdict.findings[0].ops[0] is seen and failed in verdict.findings[0].ops  # shown, as the suspect


def test_registers_find_a_cas_whose_answer_contradicts_the_value():
    held_old = checkers.registers([r("write", (1, 2), 0, 1), r("cas", (1, 2, 3), 2, 3, result=False)])
    assert not held_old.valid  # it said "not applied" while the register held 2
    lacked_old = checkers.registers([r("write", (1, 1), 0, 1), r("cas", (1, 2, 3), 2, 3, result=True)])
    assert not lacked_old.valid


def test_registers_let_an_unknown_cas_apply_only_where_it_could():
    cas = r("cas", (1, 1, 4), 2, None, "info", process="a")
    applied = [r("write", (1, 1), 0, 1), cas, r("read", 1, 5, 6, result=4)]
    assert checkers.registers(applied).valid
    impossible = [r("write", (1, 2), 0, 1), cas, r("read", 1, 5, 6, result=4)]
    assert not checkers.registers(impossible).valid


def test_registers_check_each_key_on_its_own_and_say_which_failed():
    ops = [r("write", (1, 1), 0, 1), r("read", 1, 2, 3, result=1),
           r("write", (2, 1), 0, 1), r("read", 2, 2, 3, result=0)]
    verdict = checkers.registers(ops)
    assert not verdict.valid and verdict.counts["keys violated"] == 1
    assert "key 2" in verdict.findings[0].what


def test_registers_that_run_out_of_budget_are_not_called_valid():
    ops = [r("write", (1, v), 0, 10, process=f"w{v}") for v in range(6)] + [r("read", 1, 11, 12, result=5)]
    verdict = checkers.registers(ops, budget=3)
    assert not verdict.valid and "undecided" in verdict.findings[0].what


def _simulated(seed: int, processes: int = 4, count: int = 60, lost_share: float = LOST,
               ) -> list[linearizability.RegisterOp]:
    """A history of a real register: each operation takes effect at an instant inside its
    interval; some answers are lost (unknown) after taking effect or not."""
    rng = random.Random(seed)
    ops = []
    state = None
    busy_until = [0.0] * processes
    points = []
    for _ in range(count):
        p = rng.randrange(processes)
        call = busy_until[p] + rng.uniform(0, 1)
        point = call + rng.uniform(0, 1)
        ret = point + rng.uniform(0, 1)
        busy_until[p] = ret
        points.append((point, call, ret, p))
    for _point, call, ret, _p in sorted(points):
        kind = rng.choice(["read", "write", "cas"])
        lost = rng.random() < lost_share
        if kind == "read":
            op_ = linearizability.RegisterOp("read", None, state, call, ret, True)
        elif kind == "write":
            v = rng.randrange(3)
            state = v if not lost or rng.random() < 0.5 else state
            op_ = linearizability.RegisterOp("write", v, None, call, float("inf") if lost else ret, not lost)
        else:
            old, new = rng.randrange(3), rng.randrange(3)
            applied = state == old
            if applied and (not lost or rng.random() < 0.5):
                state = new
            op_ = linearizability.RegisterOp("cas", (old, new), applied, call, float("inf") if lost else ret, not lost)
        ops.append(op_)
    return ops


@pytest.mark.parametrize("seed", range(40))
def test_the_search_accepts_every_history_of_a_real_register(seed):
    result = linearizability.check(_simulated(seed))
    assert result.linearizable is True, seed


@pytest.mark.parametrize("seed", range(40))
def test_the_search_rejects_a_real_register_s_history_with_one_read_changed(seed):
    ops = _simulated(seed)
    rng = random.Random(seed)
    reads = [i for i, o in enumerate(ops) if o.f == "read" and o.ok]
    i = rng.choice(reads)
    # a value nobody ever wrote
    ops[i] = linearizability.RegisterOp("read", None, 99, ops[i].call, ops[i].ret, True)
    result = linearizability.check(ops)
    assert result.linearizable is False and result.ops[result.stuck].result == 99


@pytest.mark.parametrize("seed", range(6))
def test_the_search_decides_a_key_s_worth_of_history_with_unknown_answers(seed):
    """A key's history as the register workload makes it (about 200 operations, a few answers
    lost) with one read of a value nobody wrote: found, not left undecided."""
    ops = _simulated(seed, processes=6, count=200, lost_share=0.03)
    reads = [i for i, o in enumerate(ops) if o.f == "read"]
    i = reads[len(reads) // 2]
    ops[i] = linearizability.RegisterOp("read", None, 99, ops[i].call, ops[i].ret, True)
    assert linearizability.check(ops, budget=500_000).linearizable is False


# -- members ---------------------------------------------------------------------------------------


def test_members_equal_accepts_equal_data_and_finds_a_difference_and_a_missing_member():
    same = {"kv": [[1, "a"], [2, "b"]], "queue": []}
    assert checkers.members_equal({"n1": same, "n2": same, "n3": same}, ["n1", "n2", "n3"]).valid
    differ = checkers.members_equal({"n1": same, "n2": {"kv": [[1, "a"]], "queue": []}, "n3": same},
                                    ["n1", "n2", "n3"])
    assert not differ.valid
    (finding,) = differ.findings
    assert "'kv'" in finding.what and "missing on n2" in finding.what and "[2, 'b']" in finding.what
    unread = checkers.members_equal({"n1": same, "n2": same}, ["n1", "n2", "n3"])
    assert not unread.valid and "n3" in unread.findings[0].what


# -- failover ---------------------------------------------------------------------------------------


def test_failover_counts_from_the_nemesis_to_the_first_write_invoked_after_it():
    ops = [kv(1, "ok", at=0.0), op("kv", "replace", 2, 9.5, 10.8), op("kv", "replace", 3, 10.1, 13.0),
           op("kv", "replace", 4, 13.0, 13.1), op("kv", "replace", 5, 10.2, 11.0, "fail")]
    (w,) = measure(ops, [Window("isolate-leader", 10.0, 20.0)])
    assert w.failover_s == pytest.approx(3.0)  # the write in flight at the start does not count
    assert w.longest_gap_s == pytest.approx(6.9)  # 13.1 .. 20.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0 and percentile([1.0, 2.0, 3.0, 4.0], 99) == 4.0


def test_the_long_forms_runner_answers_help_without_starting_the_suite():
    """It takes no arguments (only FAULTS_* variables): ``--help`` describes them, anything else
    is refused, and neither starts a run of many minutes."""
    shown = subprocess.run([sys.executable, "-m", "tests.faults.runner", "--help"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0
    assert "FAULTS_RUNS" in shown.stdout and "runs from seed" not in shown.stdout
    refused = subprocess.run([sys.executable, "-m", "tests.faults.runner", "--runs", "3"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "unrecognized arguments" in refused.stderr
    assert "runs from seed" not in refused.stdout
