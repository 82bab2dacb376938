"""The fenced examples of README.md and docs/*.md, with the marker that says how each one runs.

A block runs by its language (``python``, ``sh``, ``toml``, ``yaml``, ``lua``) unless an HTML comment
just before its fence says otherwise::

    <!-- example: not run: why -->          listed as skipped, with the reason
    <!-- example: options only: why -->     commands not run: each program exists and takes the
                                            options written (its --help), because of why
    <!-- example: console -->              an admin console transcript (``HOST:PORT> `` prompts)
    <!-- example: synopsis -->             command lines with placeholders (FILE, [DIR])
    <!-- example: fresh server -->         on a server of its own, not the document's shared one
    <!-- example: spark -->                in the local Spark session of the Spark tests
    <!-- example: in conf/x.toml -->       a TOML fragment checked within that file (its tables
                                            replace the file's tables of the same names)

Words combine with commas (``console, fresh server``). A block with no language and no marker, or
a marker word nobody knows, is an error of the document, not a skip.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!--\s*example:\s*(.*?)\s*-->$")
REASONED = ("not run", "options only")  # the marker words followed by ": reason"
WORDS = {"console", "synopsis", "fresh server", "spark"}
# What test_doc_examples did with each block, (name, what, reason), for the summary at the end.
REPORT = pytest.StashKey[list[tuple[str, str, str]]]()


class MarkerError(ValueError):
    """A marker that does not parse, with the document and line it is on."""


@dataclass(frozen=True)
class Example:
    document: str  # relative to the repository: README.md, docs/x.md
    line: int  # of the opening fence, from 1
    language: str  # the fence's info string's first word, "" for none
    text: str
    words: frozenset[str]  # the marker's words (not run and options only without their reasons)
    reason: str = ""  # for not run / options only

    @property
    def name(self) -> str:
        return f"{self.document}:{self.line}"

    @property
    def within(self) -> Path | None:
        """The file an ``in FILE`` marker names."""
        for word in self.words:
            if word.startswith("in "):
                return ROOT / word[3:].strip()
        return None


def documents() -> list[Path]:
    """README.md and every page of docs/, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def parse_marker(text: str, where: str) -> tuple[frozenset[str], str]:
    """The words and reason of a marker's text (what follows ``example:``)."""
    for word in REASONED:
        if text.startswith(word):
            reason = text[len(word):].lstrip()
            if not reason.startswith(":") or not reason[1:].strip():
                raise MarkerError(f"{where}: '{word}' needs a reason: <!-- example: {word}: why -->")
            return frozenset({word}), reason[1:].strip()
    words = frozenset(w.strip() for w in text.split(","))
    unknown = {w for w in words - WORDS if not (w.startswith("in ") and (ROOT / w[3:].strip()).is_file())}
    if unknown:
        known = ", ".join(sorted(WORDS | {f"{w}: why" for w in REASONED} | {"in FILE"}))
        raise MarkerError(f"{where}: unknown example marker {sorted(unknown)}; known: {known}")
    return words, ""


def examples_of(path: Path, text: str | None = None) -> list[Example]:
    """Every fenced block of one document, with its marker. ``text`` stands in for the file."""
    source = path.read_text() if text is None else text
    document = path.relative_to(ROOT).as_posix() if path.is_absolute() and path.is_relative_to(ROOT) else str(path)
    out: list[Example] = []
    pending: tuple[frozenset[str], str, int] | None = None
    for token in MarkdownIt("commonmark").parse(source):
        line = token.map[0] + 1 if token.map else 0
        if token.type == "html_block" and MARKER.match(token.content.strip()):
            if pending is not None:
                raise MarkerError(f"{document}:{pending[2]}: example marker followed by no fenced block")
            words, reason = parse_marker(MARKER.match(token.content.strip()).group(1), f"{document}:{line}")
            pending = (words, reason, line)
        elif token.type == "fence":
            words, reason = (pending[0], pending[1]) if pending else (frozenset(), "")
            language = token.info.split()[0] if token.info.strip() else ""
            out.append(Example(document, line, language, token.content, words, reason))
            pending = None
        elif pending is not None:
            raise MarkerError(f"{document}:{pending[2]}: example marker not directly before a fenced block")
    if pending is not None:
        raise MarkerError(f"{document}:{pending[2]}: example marker followed by no fenced block")
    return out


def all_examples() -> list[Example]:
    return [example for path in documents() for example in examples_of(path)]
