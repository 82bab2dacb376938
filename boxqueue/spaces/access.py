"""Users, roles, grants and chap-sha1: who may read, write or execute what.

Rules, as in Tarantool: ``admin`` may do everything; a grant on the universe covers every object
of its kind; a grant on a space or function covers that object. ``guest`` has full rights while no
users are configured and only its configured grants otherwise.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass, field

from boxqueue.errcodes import ER, BoxError, access_denied

GUEST_ID = 0
ADMIN_ID = 1
PUBLIC_ID = 2
REPLICATION_ID = 3
SUPER_ID = 31
FIRST_USER_ID = 32

READ = 1
WRITE = 2
EXECUTE = 4
SESSION = 8
USAGE = 16
CREATE = 32
DROP = 64
ALTER = 128
ALL = 0xFFFFFFFF

PRIVILEGE_BITS = {
    "read": READ,
    "write": WRITE,
    "execute": EXECUTE,
    "session": SESSION,
    "usage": USAGE,
    "create": CREATE,
    "drop": DROP,
    "alter": ALTER,
}
ACCESS_NAMES = {READ: "Read", WRITE: "Write", EXECUTE: "Execute", CREATE: "Create", DROP: "Drop", ALTER: "Alter"}

UNIVERSE = "universe"
SPACE = "space"
FUNCTION = "function"
OBJECT_TYPES = (UNIVERSE, SPACE, FUNCTION)


def chap_sha1_hash(password: str) -> bytes:
    """What the server keeps: SHA1(SHA1(password))."""
    return hashlib.sha1(hashlib.sha1(password.encode()).digest()).digest()


def chap_sha1_scramble(password: str, salt: bytes) -> bytes:
    """What a client sends (used by tests and the admin console's login)."""
    step1 = hashlib.sha1(password.encode()).digest()
    step2 = hashlib.sha1(step1).digest()
    step3 = hashlib.sha1(salt[:20] + step2).digest()
    return bytes(a ^ b for a, b in zip(step1, step3, strict=True))


def chap_sha1_check(stored: bytes, salt: bytes, scramble: bytes) -> bool:
    """Server check: SHA1(scramble XOR SHA1(salt20 + stored)) == stored."""
    if len(scramble) != 20:
        return False
    step3 = hashlib.sha1(salt[:20] + stored).digest()
    step1 = bytes(a ^ b for a, b in zip(scramble, step3, strict=True))
    return hmac.compare_digest(hashlib.sha1(step1).digest(), stored)  # constant time


@dataclass
class User:
    id: int
    name: str
    type: str = "user"  # user | role
    owner: int = ADMIN_ID
    password_hash: bytes | None = None  # SHA1(SHA1(password)); None: no password set
    # (object_type, object name or "" for the universe) -> privilege bits
    grants: dict[tuple[str, str], int] = field(default_factory=dict)
    # privileges_on() answers, dropped whenever grants change (checked on every request)
    _resolved: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)
    # The privileges on the universe, which cover every object: checked first, on every request.
    universe: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        self._changed()

    def _changed(self) -> None:
        self._resolved.clear()
        self.universe = ALL if self.id == ADMIN_ID else self.grants.get((UNIVERSE, ""), 0)

    def auth_map(self) -> dict[str, str]:
        if self.password_hash is None:
            return {}
        return {"chap-sha1": base64.b64encode(self.password_hash).decode()}

    def grant(self, privileges: int, object_type: str, object_name: str = "") -> None:
        key = (object_type, object_name if object_type != UNIVERSE else "")
        self.grants[key] = self.grants.get(key, 0) | privileges
        self._changed()

    def set_grants(self, grants: dict[tuple[str, str], int]) -> None:
        self.grants = grants
        self._changed()

    def privileges_on(self, object_type: str, object_name: str) -> int:
        key = (object_type, object_name)
        bits = self._resolved.get(key)
        if bits is None:
            if self.id == ADMIN_ID:
                bits = ALL
            else:
                bits = self.grants.get((UNIVERSE, ""), 0)
                if object_type != UNIVERSE:
                    bits |= self.grants.get(key, 0)
            self._resolved[key] = bits
        return bits

    def row(self) -> list:
        return [self.id, self.owner, self.name, self.type, self.auth_map()]


class AccessControl:
    """The users known to the server and the checks the request handlers call."""

    def __init__(self) -> None:
        self.users: dict[str, User] = {}
        self.by_id: dict[int, User] = {}
        for uid, name, kind in (
            (GUEST_ID, "guest", "user"),
            (ADMIN_ID, "admin", "user"),
            (PUBLIC_ID, "public", "role"),
            (REPLICATION_ID, "replication", "role"),
            (SUPER_ID, "super", "role"),
        ):
            self._add(User(uid, name, kind))
        self.by_id[ADMIN_ID].grant(ALL, UNIVERSE)
        self.by_id[SUPER_ID].grant(ALL, UNIVERSE)
        self.guest.grant(READ | WRITE | EXECUTE | SESSION | USAGE, UNIVERSE)

    def _add(self, user: User) -> None:
        self.users[user.name] = user
        self.by_id[user.id] = user

    @property
    def guest(self) -> User:
        return self.by_id[GUEST_ID]

    def add_user(self, name: str, password: str | None) -> User:
        if name in self.users:
            user = self.users[name]
        else:
            uid = max(FIRST_USER_ID - 1, max(self.by_id, default=0)) + 1
            user = User(uid, name)
            self._add(user)
        if password is not None:
            user.password_hash = chap_sha1_hash(password)
        return user

    def set_guest_grants(self, grants: list[tuple[int, str, str]]) -> None:
        self.guest.set_grants({})
        for bits, object_type, object_name in grants:
            self.guest.grant(bits, object_type, object_name)

    def authenticate(self, name: str, salt: bytes, method: object, scramble: object) -> User:
        """Check an AUTH request; return the user or raise Tarantool's error."""
        user = self.users.get(name)
        if user is None or user.type != "user":
            raise BoxError(ER.NO_SUCH_USER, name)
        if name == "guest" and method is None:
            return user
        if method != "chap-sha1":
            if isinstance(method, str) and method != "pap-sha256":
                raise BoxError(ER.UNKNOWN_AUTH_METHOD, method)
            raise BoxError(ER.INVALID_MSGPACK, "invalid scramble size")
        if isinstance(scramble, str):
            scramble = scramble.encode("utf-8", "surrogateescape")
        if not isinstance(scramble, bytes) or len(scramble) != 20:
            raise BoxError(ER.INVALID_MSGPACK, "invalid scramble size")
        stored = user.password_hash
        if stored is None:
            stored = chap_sha1_hash("") if name == "guest" else None
        if stored is None or not chap_sha1_check(stored, salt, scramble):
            raise BoxError(ER.PASSWORD_MISMATCH, name)
        return user

    def check(self, user: User, privilege: int, object_type: str, object_name: str) -> None:
        if user.universe & privilege == privilege:
            return
        if user.privileges_on(object_type, object_name) & privilege != privilege:
            shown = "" if object_type == UNIVERSE else object_name
            raise access_denied(ACCESS_NAMES.get(privilege, "Usage"), object_type, shown, user.name)

    def can_see(self, user: User, object_type: str, object_name: str) -> bool:
        return user.privileges_on(object_type, object_name) != 0
