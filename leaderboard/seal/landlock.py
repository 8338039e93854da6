"""Landlock (the Linux kernel's unprivileged sandbox) through its three syscalls, stdlib only.

``confine(read, write)`` restricts the calling process, for good, to reading the given paths and
reading and writing the other given paths; every other file open fails with EACCES. Where the
ABI has them it also denies every TCP bind and connect (v4) and scopes abstract unix sockets and
signals to the process's own domain (v6): a second wall behind the namespaces of
``leaderboard.seal.sandbox``. It must be
called before the process starts any thread: a rule set binds the calling thread and the
threads it creates afterwards. Without Landlock (another OS, an old kernel, seccomp refusing the
syscall) it returns False and changes nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys

# x86_64 and aarch64 share these (the generic syscall table).
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FILE_ONLY = EXECUTE | WRITE_FILE | READ_FILE | 1 << 14 | 1 << 15  # + TRUNCATE, IOCTL_DEV
READ = EXECUTE | READ_FILE | READ_DIR


NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The kernel's Landlock ABI version, 0 where there is none."""
    if not sys.platform.startswith("linux"):
        return 0
    version = _libc().syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                              ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(int(version), 0)


def _handled(abi: int) -> int:
    """Every filesystem right this ABI knows: 13 in v1, REFER from v2, TRUNCATE from v3,
    IOCTL_DEV from v5."""
    bits = 13 + (abi >= 2) + (abi >= 3) + (abi >= 5)
    return (1 << bits) - 1


def confine(read: list[str], write: list[str], listable: list[str] = ()) -> bool:
    """Allow reads under ``read``, everything under ``write`` and listing (no file reads)
    under ``listable``; deny every other path."""
    abi = abi_version()
    if abi < 1:
        return False
    libc, handled = _libc(), _handled(abi)
    # no net rule is added, so every TCP bind and connect is denied; older ABIs take the prefix
    attr = _RulesetAttr(handled, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        return False
    try:
        for paths, access in ((listable, READ_DIR), (read, READ), (write, handled)):
            for path in paths:
                _allow(libc, ruleset, path, access)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return True


def _allow(libc, ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # nothing there to allow
    try:
        if not os.path.isdir(path):
            access &= FILE_ONLY
        rule = _PathBeneath(access, fd)
        if libc.syscall(SYS_ADD_RULE, ruleset, RULE_PATH_BENEATH, ctypes.byref(rule),
                        ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule({path})")
    finally:
        os.close(fd)
