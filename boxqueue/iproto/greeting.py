"""The 128-byte greetings: binary (iproto) and Lua console.

Both are two 64-byte lines, each padded with spaces to 63 bytes and ended by ``\\n``. The binary
one names the version, the protocol and the instance uuid, then carries a base64 salt; clients
use the first 20 decoded bytes of the salt for chap-sha1.
"""

from __future__ import annotations

import base64
import os
import re

from construct import Const, PaddedString, Struct

# The version we advertise. At or above 2.10.0 the Python connector negotiates with ID; the
# version line must stay X.Y.Z (no -N-gHASH suffix) so the uuid fits in 63 bytes.
VERSION = "2.11.0"
VERSION_FULL = "2.11.0-0-gb0c5c0e"
VERSION_ID = (2 << 16) | (11 << 8) | 0

GREETING = Struct(
    "line1" / PaddedString(63, "ascii"),
    Const(b"\n"),
    "line2" / PaddedString(63, "ascii"),
    Const(b"\n"),
)
GREETING_SIZE = GREETING.sizeof()

_LINE1 = re.compile(r"^Tarantool (\S+) \((\w[\w ]*)\)(?: (\S+))?")


def _pad(text: str) -> str:
    # construct pads with NUL bytes; Tarantool pads with spaces.
    return text.ljust(63)


def binary_greeting(instance_uuid: str, salt: bytes | None = None) -> tuple[bytes, bytes]:
    """The binary greeting and the salt it carries (32 random bytes unless given)."""
    salt = salt if salt is not None else os.urandom(32)
    line1 = f"Tarantool {VERSION} (Binary) {instance_uuid}"
    if len(line1) > 63:
        raise ValueError("greeting line too long")
    data = GREETING.build({"line1": _pad(line1), "line2": _pad(base64.b64encode(salt).decode())})
    return data, salt


def console_greeting() -> bytes:
    return GREETING.build(
        {
            "line1": _pad(f"Tarantool {VERSION_FULL} (Lua console)"),
            "line2": _pad("type 'help' for interactive help"),
        }
    )


def parse_greeting(data: bytes) -> dict[str, object]:
    """Version, protocol, uuid and salt of a greeting (used by tests and tools)."""
    parsed = GREETING.parse(data)
    match = _LINE1.match(parsed.line1)
    if match is None:
        raise ValueError("not a Tarantool greeting")
    salt_text = parsed.line2.strip()
    return {
        "version": match.group(1),
        "protocol": match.group(2),
        "uuid": match.group(3),
        "salt": base64.b64decode(salt_text) if match.group(2) == "Binary" else b"",
    }
