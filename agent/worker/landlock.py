"""Landlock: the file system read-only but for a few paths, set by the worker on itself.

Where bubblewrap is missing (evaluation/isolation.py), the worker restricts itself with Landlock
(Linux >= 5.13, unprivileged) as the first thing it does, before any candidate or package code
exists in the process: every write, create, remove, rename or link anywhere is refused by the
kernel but under the paths the parent names in OPTAGENT_LANDLOCK (its scratch directory; the cache
for the judge), and writes to the device files under /dev. Where the kernel has them it also refuses
TCP bind and connect (ABI 4) and signals and abstract sockets to processes outside this domain
(ABI 6: the orchestrator and the rest of the user's processes). The restriction is inherited by every
child and cannot be lifted (no_new_privs is set first). Reads stay allowed, as under bwrap.
"""

from __future__ import annotations

import ctypes
import os
from typing import Sequence

from optagent.settings import LANDLOCK_ENV as ENV

# x86-64 and arm64 alike (these syscalls came after the tables were unified)
CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

WRITE_FILE = 1 << 1
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
WRITES_V1 = (WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO
             | MAKE_BLOCK | MAKE_SYM)
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in the kernel's header
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi() -> int:
    """The Landlock ABI version this kernel offers; 0 where it has none (too old, or disabled)."""
    try:
        libc = _libc()
        libc.syscall.restype = ctypes.c_long
        version = libc.syscall(CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(int(version), 0)


def _check(value: int, what: str) -> int:
    if value < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock {what}: {os.strerror(err)}")
    return value


def restrict(writable: Sequence[str]) -> int:
    """Make everything but `writable` (and writes to devices under /dev) read-only for this process and
    all it starts; returns the ABI used. OSError where the kernel refuses (the worker then stops)."""
    version = abi()
    if version < 1:
        raise OSError("Landlock is not available in this kernel (Linux >= 5.13 with landlock in its LSM list)")
    fs = WRITES_V1 | (REFER if version >= 2 else 0) | (TRUNCATE if version >= 3 else 0)
    attr = RulesetAttr(fs, NET_BIND_TCP | NET_CONNECT_TCP if version >= 4 else 0,
                       SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if version >= 6 else 0)
    size = ctypes.sizeof(RulesetAttr) if version >= 6 else (16 if version >= 4 else 8)
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    ruleset = _check(libc.syscall(CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)),
                     "create_ruleset")
    try:
        rules = [(p, fs) for p in writable] + [("/dev", WRITE_FILE | (TRUNCATE if version >= 3 else 0))]
        for path, access in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = PathBeneathAttr(access, fd)
                _check(libc.syscall(ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH),
                                    ctypes.byref(rule), ctypes.c_uint32(0)), f"add_rule {path}")
            finally:
                os.close(fd)
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        _check(libc.syscall(RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)), "restrict_self")
    finally:
        os.close(ruleset)
    return version


def apply_from_env() -> None:
    """The restriction the parent asked for in OPTAGENT_LANDLOCK (paths, os.pathsep between), if any."""
    paths = os.environ.pop(ENV, None)
    if paths is not None:
        restrict([p for p in paths.split(os.pathsep) if p])
