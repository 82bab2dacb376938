"""A small disk for a member's data directory: a tmpfs that a filler file fills to the brim.

The mount's source is named after the run (:meth:`Topology.mount_source`), so a run that died
leaves nothing :func:`tests.faults.netns.remove_stale` does not find. The member runs in a
namespace of its own but shares the root's mounts: it sees the tmpfs mounted before it starts,
and the filler written from here takes the room from under it.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tests.faults.netns import run

FILLER = ".bqfaults-filler"  # at the mount's root, beside the member's files


@dataclass
class SmallDisk:
    path: Path
    source: str
    size_mb: int = 256
    mounted: bool = False

    def mount(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        run("mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m,mode=0755", self.source, str(self.path))
        self.mounted = True

    @property
    def filler(self) -> Path:
        return self.path / FILLER

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self) -> int:
        """Fills the disk until the kernel says ENOSPC; returns the filler's size. What the member
        frees afterwards (a file it deletes) is taken again by :meth:`top_up`."""
        with open(self.filler, "ab", buffering=0) as f:
            room = self.free_bytes()
            if room > 0:
                with contextlib.suppress(OSError):
                    os.posix_fallocate(f.fileno(), f.tell(), room)
            self._write_until_full(f)
        return self.filler.stat().st_size

    def top_up(self) -> None:
        """Takes any room freed since :meth:`fill`."""
        if self.filler.exists():
            with open(self.filler, "ab", buffering=0) as f:
                self._write_until_full(f)

    @staticmethod
    def _write_until_full(f: BinaryIO) -> None:
        """Unbuffered writes, so that nothing is left to flush (and fail) at close."""
        f.seek(0, os.SEEK_END)
        block = b"\0" * 4096
        while True:
            try:
                if not f.write(block):
                    return
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.filler.unlink()

    def unmount(self) -> None:
        if self.mounted:
            self.free()
            run("umount", "-l", str(self.path), check=False)
            self.mounted = False
