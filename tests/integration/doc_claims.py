"""What an example's trailing comment says a result is, and whether a result is that.

A comment is a claim when it begins with a value: ``# [[0, 't', 'hello']]``, ``# 201 {"success":true}``
(an HTTP status, then the body), ``# {'tasks': {...}, 'calls': {...}}``; or with an error name:
``# ER_PROC_LUA "unsupported Lua type 'userdata'"``. Anything else (``# waits up to 5 s``) is prose.
Prose may follow a value after a comma (``# [[0, 't', 'hello']], waits up to 10 s``).

In a value, a bare name (``id``) or ``...`` stands for any value and ``{...}`` for any mapping;
``true``, ``false`` and ``null`` are JSON's. Lists and tuples match element by element, mappings
key by key (the same keys), everything else by equality.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from boxqueue.errcodes import ER

_ERROR = re.compile(r'^ER_([A-Z_]+)(?:\s+"(.*)")?(?:$|[\s,])')
_STATUS = re.compile(r"^([1-5]\d\d)(?:\s+|$)")
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?(?=$|[\s,])")
_JSON_NAMES = {"true": True, "false": False, "null": None}
_OPEN = {"[": "]", "{": "}", "(": ")"}


class ClaimFailed(AssertionError):
    pass


@dataclass(frozen=True)
class Claim:
    text: str  # the comment, without its '#'
    status: int | None = None  # an HTTP status
    value: ast.expr | None = None  # the claimed value, as an expression to match against
    error: ER | None = None  # the claimed error
    error_text: str = ""  # ... whose message holds this

    def check_value(self, actual: Any) -> None:
        if self.error is not None:
            raise ClaimFailed(f"the comment says {self.text!r}, but it answered {actual!r}")
        if self.value is not None and not matches(self.value, actual):
            raise ClaimFailed(f"the comment says {self.text!r}, but it answered {actual!r}")

    def check_error(self, code: int, message: str) -> None:
        if self.error is None:
            raise ClaimFailed(f"the comment says {self.text!r}, but it failed: {code} {message!r}")
        if code != self.error or self.error_text not in message:
            raise ClaimFailed(f"the comment says {self.text!r}, but it failed with {code} {message!r}")


def _leading_literal(text: str) -> str | None:
    """The value at the start of ``text``: a bracketed literal, a quoted string or a number."""
    if not text:
        return None
    if text[0] in _OPEN:
        stack, quote = [], ""
        for i, ch in enumerate(text):
            if quote:
                if ch == "\\":
                    continue
                if ch == quote:
                    quote = ""
            elif ch in "'\"":
                quote = ch
            elif ch in _OPEN:
                stack.append(_OPEN[ch])
            elif ch in ")]}":
                if not stack or stack.pop() != ch:
                    return None
                if not stack:
                    return text[: i + 1]
        return None
    if text[0] in "'\"":
        end = text.find(text[0], 1)
        return text[: end + 1] if end > 0 else None
    number = _NUMBER.match(text)
    return number.group(0) if number else None


def claim_of(comment: str) -> Claim | None:
    """The claim a comment makes, or None for prose."""
    text = comment.lstrip("#").strip()
    error = _ERROR.match(text)
    if error is not None:
        if error.group(1) not in ER.__members__:
            raise ValueError(f"the comment {text!r} names no error of boxqueue.errcodes")
        return Claim(text, error=ER[error.group(1)], error_text=error.group(2) or "")
    status = None
    rest = text
    found = _STATUS.match(text)
    if found is not None:
        rest = text[found.end():]
        if rest and rest[0] not in _OPEN:
            return None  # a number and prose ("5 s")
        status = int(found.group(1))
    literal = _leading_literal(rest)
    if literal is None:
        return Claim(text, status=status) if status is not None and not rest else None
    after = rest[len(literal):].strip()
    if after and not after.startswith(","):
        return None
    try:
        value = ast.parse(literal, mode="eval").body
    except SyntaxError:
        return None
    return Claim(text, status=status, value=value)


def matches(pattern: ast.expr, actual: Any) -> bool:
    if isinstance(pattern, ast.Constant):
        if pattern.value is Ellipsis:
            return True
        return _same(pattern.value, actual)
    if isinstance(pattern, ast.UnaryOp) and isinstance(pattern.op, ast.USub):
        return _same(ast.literal_eval(pattern), actual)
    if isinstance(pattern, ast.Name):
        if pattern.id in _JSON_NAMES:
            return _same(_JSON_NAMES[pattern.id], actual)
        return True  # a placeholder: any value
    if isinstance(pattern, ast.Set):
        if len(pattern.elts) == 1 and isinstance(pattern.elts[0], ast.Constant) and pattern.elts[0].value is Ellipsis:
            return isinstance(actual, dict)
        raise ValueError(f"a set in a claim: {ast.unparse(pattern)}")
    if isinstance(pattern, ast.List | ast.Tuple):
        return (isinstance(actual, list | tuple) and len(actual) == len(pattern.elts)
                and all(matches(p, a) for p, a in zip(pattern.elts, actual, strict=True)))
    if isinstance(pattern, ast.Dict):
        if not isinstance(actual, dict):
            return False
        keys = [ast.literal_eval(k) for k in pattern.keys if k is not None]
        if len(keys) != len(pattern.keys) or set(keys) != set(actual):
            return False
        return all(matches(p, actual[k]) for k, p in zip(keys, pattern.values, strict=True))
    raise ValueError(f"cannot match a claim written as {ast.unparse(pattern)}")


def _same(expected: Any, actual: Any) -> bool:
    return isinstance(actual, bool) == isinstance(expected, bool) and actual == expected
