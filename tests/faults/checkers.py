"""Checkers: pure functions over a run's history and the data every member holds after healing.

Each returns a :class:`Verdict`: valid or not, what it counted, and each violation as a
:class:`Finding` naming the operations involved. The rules (an answer is a promise):

* :func:`unique_writes`: a write answered ok is on every member; a write answered "failed" is on
  none.
* :func:`queue`: a put answered ok is still there at the end unless an ack of it may have been
  applied; a task whose ack was answered ok is never delivered again nor there at the end; a put
  answered "failed" is never delivered nor there.
* :func:`registers`: each key's reads, writes and compare-and-sets are linearizable
  (:mod:`tests.faults.linearizability`), unknown ones taking effect at any point after their call
  or never, failed ones never.
* :func:`members_equal`: every member holds the same data.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.faults import linearizability
from tests.faults.history import Op


@dataclass
class Finding:
    what: str
    ops: list[Op] = field(default_factory=list)

    def describe(self, indent: str = "    ") -> str:
        return "\n".join([self.what, *(indent + op.describe() for op in self.ops)])


@dataclass
class Verdict:
    checker: str
    valid: bool
    counts: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def report(self, limit: int = 5) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in self.counts.items())
        head = f"{self.checker}: {'valid' if self.valid else 'VIOLATED'}" + (f" ({counts})" if counts else "")
        lines = [head]
        for finding in self.findings[:limit]:
            lines.append("  - " + finding.describe())
        if len(self.findings) > limit:
            lines.append(f"  ... and {len(self.findings) - limit} more findings")
        return "\n".join(lines)


def _outcomes(ops: Iterable[Op]) -> dict[str, int]:
    counts = {"ok": 0, "fail": 0, "info": 0}
    for op in ops:
        if op.type is not None:
            counts[op.type] += 1
    return counts


def _group_findings(what: str, by_member: Mapping[Op, list[str]], limit: int = 20) -> list[Finding]:
    """One finding per operation: ``what`` and the members concerned."""
    return [Finding(f"{what} on {', '.join(sorted(members))}", [op])
            for op, members in list(by_member.items())[:limit]] + (
        [Finding(f"... {len(by_member) - limit} more: {what}")] if len(by_member) > limit else [])


def unique_writes(ops: list[Op], final: Mapping[str, set[Any]], name: str = "unique writes") -> Verdict:
    """``ops``: writes of unique keys (``op.value`` the key); ``final``: member -> the keys it holds."""
    lost: dict[Op, list[str]] = defaultdict(list)
    kept_failed: dict[Op, list[str]] = defaultdict(list)
    info_kept = 0
    for op in ops:
        held_by = [m for m, keys in final.items() if op.value in keys]
        if op.type == "ok":
            for member in final:
                if member not in held_by:
                    lost[op].append(member)
        elif op.type == "fail" and held_by:
            kept_failed[op] = held_by
        elif op.type == "info" and held_by:
            info_kept += 1
    counts = _outcomes(ops) | {"unknown kept": info_kept, "lost": len(lost), "failed but kept": len(kept_failed)}
    findings = (_group_findings("acknowledged write lost: missing", lost)
                + _group_findings("write answered 'failed' was kept: found", kept_failed))
    return Verdict(name, not lost and not kept_failed, counts, findings)


def queue(ops: list[Op], final: Mapping[str, set[Any]], name: str = "queue") -> Verdict:
    """``ops``: ``put`` (value: the task's payload), ``take`` (result: the payloads delivered, a
    list), ``ack`` (value: the payload). ``final``: member -> the payloads of the tasks it holds."""
    puts: dict[Any, list[Op]] = defaultdict(list)
    acks: dict[Any, list[Op]] = defaultdict(list)
    deliveries: dict[Any, list[Op]] = defaultdict(list)
    for op in ops:
        if op.f == "put":
            puts[op.value].append(op)
        elif op.f == "ack":
            acks[op.value].append(op)
        elif op.f == "take" and op.type == "ok":
            for payload in op.result or ():
                deliveries[payload].append(op)
    lost: dict[Op, list[str]] = defaultdict(list)
    redelivered: list[Finding] = []
    acked_present: dict[Op, list[str]] = defaultdict(list)
    failed_seen: list[Finding] = []
    for payload, put_ops in puts.items():
        may_be_acked = any(a.type in ("ok", "info") for a in acks[payload])
        for put in put_ops:
            if put.type == "ok" and not may_be_acked:
                for member, held in final.items():
                    if payload not in held:
                        lost[put].append(member)
            if put.type == "fail":
                seen_in = [m for m, held in final.items() if payload in held]
                if deliveries[payload] or seen_in:
                    where = ([f"delivered {len(deliveries[payload])} times"] if deliveries[payload] else []) + (
                        [f"held by {', '.join(seen_in)}"] if seen_in else [])
                    failed_seen.append(Finding(f"put answered 'failed' was kept: {', '.join(where)}",
                                               [put, *deliveries[payload][:3]]))
        for ack in acks[payload]:
            if ack.type != "ok":
                continue
            assert ack.completed is not None
            later = [t for t in deliveries[payload] if t.invoked > ack.completed]
            if later:
                redelivered.append(Finding("task delivered again after its ack was acknowledged",
                                           [ack, *later[:3]]))
            for member, held in final.items():
                if payload in held:
                    acked_present[ack].append(member)
    counts = {f"{f} {k}": v for f in ("put", "take", "ack")
              for k, v in _outcomes(op for op in ops if op.f == f).items()}
    counts |= {"puts lost": len(lost), "redelivered": len(redelivered), "acked but present": len(acked_present),
               "failed but kept": len(failed_seen)}
    gone: list[Finding] = []
    for put, members in list(lost.items())[:20]:
        payload = put.value
        failed_acks = [a for a in acks[payload] if a.type == "fail"]
        where = f"held by none of {', '.join(sorted(members))}" if len(members) == len(final) else \
            f"missing on {', '.join(sorted(members))}"
        if failed_acks:
            what = (f"task gone ({where}) although every ack of it was answered 'failed': a failed ack "
                    f"took effect, or an acknowledged put was lost")
        else:
            what = f"acknowledged put lost: never acked, {where}"
        gone.append(Finding(what, [put, *deliveries[payload][:2], *failed_acks[:2]]))
    findings = (gone + redelivered[:20]
                + _group_findings("task whose ack was acknowledged is still held", acked_present) + failed_seen[:20])
    return Verdict(name, not (lost or redelivered or acked_present or failed_seen), counts, findings)


def registers(ops: list[Op], budget: int = 2_000_000) -> Verdict:
    """``ops``: ``read`` (value: key; result: the value, None when absent), ``write`` (value:
    (key, v)), ``cas`` (value: (key, old, new); result: whether it applied)."""
    by_key: dict[Any, list[linearizability.RegisterOp]] = defaultdict(list)
    failed: dict[Any, list[Op]] = defaultdict(list)  # not searched; shown beside a violation
    for op in ops:
        if op.completed is None:
            continue
        ret = op.completed if op.type == "ok" else float("inf")
        if op.f == "read":
            key, arg = op.value, None
        elif op.f == "write":
            key, arg = op.value
        else:
            key, old, new = op.value
            arg = (old, new)
        if op.type == "fail":
            failed[key].append(op)
            continue
        by_key[key].append(linearizability.RegisterOp(op.f, arg, op.result, op.invoked, ret, op.type == "ok", op))
    findings: list[Finding] = []
    undecided = 0
    for key in sorted(by_key, key=repr):
        result = linearizability.check(by_key[key], budget=budget)
        if result.linearizable:
            continue
        if result.linearizable is None:
            undecided += 1
            findings.append(Finding(f"key {key!r}: undecided, the search ran out of its budget "
                                    f"({result.explored} steps over {len(result.ops)} operations)"))
            continue
        assert result.stuck is not None
        stuck = result.ops[result.stuck]
        path = [result.ops[i].ref for i in result.deepest[-6:]]
        concurrent = [o.ref for o in result.ops if o is not stuck and o.call < stuck.ret and o.ret > stuck.call
                      and o.ref not in path][:6]
        since = min(stuck.call, result.ops[result.deepest[-1]].call) if result.deepest else float("-inf")
        concurrent += [o for o in failed[key] if o.invoked < stuck.ret and (o.completed or 0) > since][:4]
        states = ", ".join(repr(s) for s in result.states_at_stuck) or "?"
        findings.append(Finding(
            f"key {key!r}: not linearizable. After {len(result.deepest)} operations linearized, "
            f"the register could hold {states}, which cannot explain the first operation below; "
            f"then the last operations of that order, those concurrent with it, and the failed ones "
            f"(which the search leaves out) since the last of that order", [stuck.ref, *path, *concurrent]))
    counts = {f"{f} {k}": v for f in ("read", "write", "cas")
              for k, v in _outcomes(op for op in ops if op.f == f).items()}
    counts |= {"cas ok-false": sum(1 for op in ops if op.f == "cas" and op.type == "ok" and not op.result),
               "keys": len(by_key), "keys violated": len(findings) - undecided, "keys undecided": undecided}
    return Verdict("registers linearizable", not findings, counts, findings)


def members_equal(data: Mapping[str, Mapping[str, list[Any]]], members: Iterable[str], limit: int = 5,
                  ) -> Verdict:
    """``data``: member -> space -> its rows (sorted), for each of ``members`` that could be
    read. Every member must hold the same; one that could not be read is a finding too."""
    findings = [Finding(f"{m}'s data could not be read after healing") for m in sorted(members) if m not in data]
    members = sorted(data)
    spaces = sorted({s for m in members for s in data[m]})
    for space in spaces:
        rows = {m: {repr(r): r for r in data[m].get(space, [])} for m in members}
        every = {k: r for held in rows.values() for k, r in held.items()}
        # rows not on every member, grouped by who holds them
        by_holders: dict[tuple[str, ...], list[Any]] = defaultdict(list)
        for k in sorted(every):
            holders = tuple(m for m in members if k in rows[m])
            if len(holders) < len(members):
                by_holders[holders].append(every[k])
        for holders, only in by_holders.items():
            missing_on = [m for m in members if m not in holders]
            shown = ", ".join(repr(r) for r in only[:limit]) + (" ..." if len(only) > limit else "")
            findings.append(Finding(f"space {space!r}: {len(only)} rows on {', '.join(holders)}, "
                                    f"missing on {', '.join(missing_on)}: {shown}"))
    counts = {"members read": len(members), "spaces": len(spaces),
              "rows": sum(len(v) for v in (data[members[0]] if members else {}).values())}
    return Verdict("members equal", not findings, counts, findings)
