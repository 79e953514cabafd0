"""A seccomp filter on the candidate process: system calls no kernel needs, refused by the kernel.

Set by the worker on itself (prctl PR_SET_SECCOMP, after no_new_privs) before any candidate code
exists in the process, under every isolation; inherited by every child and thread, never lifted.
Refused with EPERM: ptrace and process_vm_readv/writev (reading or steering another process),
new namespaces (unshare, setns, clone with a CLONE_NEW* flag: a way around the sandbox's view),
mount and the new mount API, chroot and pivot_root, bpf, userfaultfd, the kernel keyring, module
loading and kexec, open_by_handle_at. clone3 answers ENOSYS (its flags sit behind a pointer the
filter cannot read), so that the C library falls back to clone, whose flags it can. execve stays
allowed: Triton and TileLang run ptxas and nvcc at the first call of a kernel. A system call of
another ABI (x32, or a foreign architecture) kills the process.

The program is classic BPF, assembled here: no compiler, no library.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
OFF_NR, OFF_ARCH, OFF_ARG0 = 0, 4, 16  # struct seccomp_data (the low word of args[0]: little-endian)
X32_BIT = 0x40000000
CLONE_NEW = 0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
CLONE3 = 435
NEW_MOUNT_API = list(range(428, 434)) + [442]  # open_tree .. fspick, mount_setattr (same on both)
# name: (x86_64, aarch64)
DENIED = {"ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
          "unshare": (272, 97), "setns": (308, 268), "mount": (165, 40), "umount2": (166, 39),
          "pivot_root": (155, 41), "chroot": (161, 51), "bpf": (321, 280), "userfaultfd": (323, 282),
          "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218), "kexec_load": (246, 104),
          "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
          "open_by_handle_at": (304, 265)}
CLONE = (56, 220)
ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def program(machine: str) -> bytes:
    """The filter for `machine` (platform.machine()), as struct sock_filter[]."""
    column, arch = ARCHES[machine]
    eperm, enosys = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS
    ops = [_op(LD_W_ABS, OFF_ARCH), _op(JEQ_K, arch, 1, 0), _op(RET_K, RET_KILL_PROCESS), _op(LD_W_ABS, OFF_NR)]
    if machine == "x86_64":  # the x32 ABI's numbers carry this bit: none of ours
        ops += [_op(JGE_K, X32_BIT, 0, 1), _op(RET_K, RET_KILL_PROCESS)]
    for nr in sorted({numbers[column] for numbers in DENIED.values()} | set(NEW_MOUNT_API)):
        ops += [_op(JEQ_K, nr, 0, 1), _op(RET_K, eperm)]
    ops += [_op(JEQ_K, CLONE3, 0, 1), _op(RET_K, enosys)]
    ops += [_op(JEQ_K, CLONE[column], 0, 3), _op(LD_W_ABS, OFF_ARG0), _op(JSET_K, CLONE_NEW, 0, 1),
            _op(RET_K, eperm)]
    ops += [_op(RET_K, RET_ALLOW)]
    return b"".join(ops)


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def restrict() -> bool:
    """Install the filter on this process (and all it starts); False on an architecture it has no
    table for (the process then runs without it), OSError where the kernel refuses."""
    machine = platform.machine()
    if machine not in ARCHES:
        return False
    code = program(machine)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = SockFprog(len(code) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    for args in ((PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0)):
        if libc.prctl(*[ctypes.c_ulong(a) for a in args]) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"seccomp: prctl {args[0]}: {os.strerror(err)}")
    return True
