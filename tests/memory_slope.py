"""Reading a server's memory over time: RSS samples and the slope of their trend.

A leak shows as a slope, not as an end point: a server's RSS jumps while its allocators warm up
(arenas, caches, LMDB pages first touched) and then stays flat, or keeps climbing at a steady
rate per request. The soak and fuzz tests sample RSS as they go and judge the samples taken after
a warm-up by their least-squares slope.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


def memory_kib(pid: int) -> dict[str, int]:
    """``VmRSS``, ``RssAnon`` and ``RssFile`` of process ``pid``, in KiB (Linux).

    ``RssFile`` holds the pages of mapped files (LMDB's data file): stored data, not leaked memory.
    ``RssAnon`` is the heap, where a leak grows.
    """
    out = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0])
    return out


def slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ys over xs (0 for fewer than two distinct xs)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx = sum(xs) / n
    my = sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


@dataclass
class Sample:
    label: str  # what ran just before it (an API's name)
    requests: int  # requests made since the start, all APIs
    kib: dict[str, int]


@dataclass
class MemoryTrace:
    """RSS samples of one process, each after a block of some API's requests."""

    pid: int
    samples: list[Sample] = field(default_factory=list)

    def sample(self, label: str, requests: int) -> Sample:
        s = Sample(label, requests, memory_kib(self.pid))
        self.samples.append(s)
        return s

    def after(self, warm_up: int) -> list[Sample]:
        """The samples from index ``warm_up`` on."""
        return self.samples[warm_up:]

    def growth_kib(self, warm_up: int, key: str = "VmRSS") -> int:
        kept = self.after(warm_up)
        return kept[-1].kib[key] - kept[0].kib[key] if kept else 0

    def bytes_per_request(self, warm_up: int, key: str = "VmRSS") -> float:
        """The trend's slope after the warm-up, in bytes of RSS per request."""
        kept = self.after(warm_up)
        return 1024 * slope([s.requests for s in kept], [s.kib[key] for s in kept])

    def growth_by_label(self, warm_up: int, key: str = "VmRSS") -> dict[str, tuple[int, int]]:
        """Per label: (KiB grown during its blocks, requests of its blocks), after the warm-up. A
        block's growth is its sample's RSS less the sample before it."""
        out: dict[str, tuple[int, int]] = {}
        kept = self.samples[max(warm_up - 1, 0):]
        for before, now in itertools.pairwise(kept):
            grown, requests = out.get(now.label, (0, 0))
            out[now.label] = (grown + now.kib[key] - before.kib[key], requests + now.requests - before.requests)
        return out

    def series(self, points: int = 20) -> str:
        """RSS at about ``points`` evenly spaced samples: the shape of the curve."""
        step = max(1, len(self.samples) // points)
        return "\n".join(f"{s.requests:>10} requests: RSS {s.kib['VmRSS']} KiB, anon {s.kib['RssAnon']} KiB"
                         for s in self.samples[::step])

    def report(self, warm_up: int) -> str:
        """A table of what each API's blocks grew, for a failure's message."""
        lines = [f"{'api':<18} {'requests':>10} {'RSS KiB':>9} {'anon KiB':>9} {'B/request':>10}"]
        rss = self.growth_by_label(warm_up)
        anon = self.growth_by_label(warm_up, "RssAnon")
        for label, (grown, requests) in sorted(rss.items(), key=lambda item: -item[1][0]):
            per = 1024 * grown / requests if requests else 0.0
            lines.append(f"{label:<18} {requests:>10} {grown:>9} {anon[label][0]:>9} {per:>10.1f}")
        kept = self.after(warm_up)
        if kept:
            lines.append(
                f"after the warm-up: {kept[-1].requests - kept[0].requests} requests, RSS "
                f"{kept[0].kib['VmRSS']} -> {kept[-1].kib['VmRSS']} KiB (anon {kept[0].kib['RssAnon']} -> "
                f"{kept[-1].kib['RssAnon']}), trend {self.bytes_per_request(warm_up):.2f} B/request "
                f"(anon {self.bytes_per_request(warm_up, 'RssAnon'):.2f})"
            )
        return "\n".join(lines)
