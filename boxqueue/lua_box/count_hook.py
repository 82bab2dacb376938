"""The embedded LuaJIT's count hook, switched from Python.

box.lua switches the hook itself (through LuaJIT's FFI) on the hot path: on when a job starts or
gets an answer, off before it yields an operation or returns. Two cases are left to the driver,
because no Lua may run for them: after the yielding hook fired (the hook is still on, and the
driver may run other Lua before resuming the job), and after an error escaped a job with the
hook on. This is ``lua_sethook`` of the library lupa loaded, called through ctypes.
"""

from __future__ import annotations

import ctypes

from lupa import luajit21

LUA_MASKCOUNT = 8


class CountHook:
    """``lua_sethook`` on one runtime: the yielding hook (LuaJIT's ``lua_yield``) or none."""

    def __init__(self, state_address: int, interval: int) -> None:
        library = ctypes.CDLL(luajit21.__file__)
        self._sethook = library.lua_sethook
        self._sethook.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        self._sethook.restype = ctypes.c_int
        self._yield = ctypes.cast(library.lua_yield, ctypes.c_void_p).value
        self._state = state_address
        self._interval = interval

    def yielding(self) -> None:
        self._sethook(self._state, self._yield, LUA_MASKCOUNT, self._interval)

    def off(self) -> None:
        self._sethook(self._state, None, 0, 0)
