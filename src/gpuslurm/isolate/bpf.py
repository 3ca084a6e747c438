"""cgroup v2 device limits: a ``BPF_PROG_TYPE_CGROUP_DEVICE`` program assembled here, in Python.

cgroup v2 has no ``devices.deny`` file; the kernel asks the BPF programs attached to a process's
cgroup and to its ancestors whether an open (or mknod) of a device may go ahead, and any of them
saying no is final. The program built here answers no for a fixed list of character devices and
yes for everything else (a deny list, as Slurm uses for GPUs), so it composes with whatever
systemd or Slurm attach: it is attached with ``BPF_F_ALLOW_MULTI`` and never replaces theirs.

The syscall goes through ctypes (``bpf(2)`` has no libc wrapper); loading needs ``CAP_BPF`` (or
``CAP_SYS_ADMIN``) and attaching needs ``CAP_NET_ADMIN``/``CAP_SYS_ADMIN``, which the prolog has
as root and the job's user has not, so a job cannot detach it. The attachment holds its own
reference to the program: the descriptors can be closed, and removing the cgroup frees both.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from collections.abc import Iterable

from gpuslurm.errors import HardwareError

# include/uapi/linux/bpf.h
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_QUERY = 16
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6  # attach type
BPF_F_ALLOW_MULTI = 2
BPF_DEVCG_DEV_CHAR = 2  # low 16 bits of bpf_cgroup_dev_ctx.access_type

_SYSCALL_NR = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}

# Opcodes (class | op | source), for the few instructions the program needs.
_LDX_MEM_W = 0x61  # dst = *(u32 *)(src + off)
_ALU64_AND_K = 0x57  # dst &= imm
_ALU64_MOV_K = 0xB7  # dst = imm
_JMP_JNE_K = 0x55  # if dst != imm: pc += off
_JMP_EXIT = 0x95
_R0, _R1, _R2, _R3, _R4 = range(5)


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """One ``struct bpf_insn``: opcode, dst/src registers in one byte, s16 offset, s32 immediate."""
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def deny_program(denied: Iterable[tuple[int, int]]) -> bytes:
    """Instructions that refuse the character devices ``(major, minor)`` and allow the rest.

    Per device four instructions: two compares that skip ahead unless both numbers match, then
    ``return 0``. No backward jumps and no jump longer than three, so the verifier accepts any
    length up to its instruction limit.
    """
    code = [
        _insn(_LDX_MEM_W, _R2, _R1, 0),  # access_type: (access << 16) | device type
        _insn(_ALU64_AND_K, _R2, imm=0xFFFF),
        _insn(_LDX_MEM_W, _R3, _R1, 4),  # major
        _insn(_LDX_MEM_W, _R4, _R1, 8),  # minor
    ]
    rules = sorted(set(denied))
    # Block devices (and anything but char devices) skip every rule.
    code.append(_insn(_JMP_JNE_K, _R2, off=4 * len(rules), imm=BPF_DEVCG_DEV_CHAR))
    for major, minor in rules:
        if not (0 <= major < 1 << 31 and 0 <= minor < 1 << 31):
            raise ValueError(f"device number {major}:{minor} out of range")
        code += [
            _insn(_JMP_JNE_K, _R3, off=3, imm=major),
            _insn(_JMP_JNE_K, _R4, off=2, imm=minor),
            _insn(_ALU64_MOV_K, _R0, imm=0),
            _insn(_JMP_EXIT),
        ]
    code += [_insn(_ALU64_MOV_K, _R0, imm=1), _insn(_JMP_EXIT)]
    return b"".join(code)


class _LoadAttr(ctypes.Structure):
    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32),
                ("insns", ctypes.c_uint64), ("license", ctypes.c_uint64),
                ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
                ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32),
                ("prog_flags", ctypes.c_uint32), ("prog_name", ctypes.c_char * 16),
                ("prog_ifindex", ctypes.c_uint32), ("expected_attach_type", ctypes.c_uint32)]


class _AttachAttr(ctypes.Structure):
    _fields_ = [("target_fd", ctypes.c_uint32), ("attach_bpf_fd", ctypes.c_uint32),
                ("attach_type", ctypes.c_uint32), ("attach_flags", ctypes.c_uint32),
                ("replace_bpf_fd", ctypes.c_uint32)]


class _QueryAttr(ctypes.Structure):
    _fields_ = [("target_fd", ctypes.c_uint32), ("attach_type", ctypes.c_uint32),
                ("query_flags", ctypes.c_uint32), ("attach_flags", ctypes.c_uint32),
                ("prog_ids", ctypes.c_uint64), ("prog_cnt", ctypes.c_uint32)]


def _bpf(cmd: int, attr: ctypes.Structure, what: str) -> int:
    nr = _SYSCALL_NR.get(platform.machine())
    if nr is None:
        raise HardwareError(f"{what}: bpf(2) syscall number unknown on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ret = int(libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), ctypes.byref(attr),
                           ctypes.c_uint(ctypes.sizeof(attr))))
    if ret < 0:
        err = ctypes.get_errno()
        raise HardwareError(f"{what}: {os.strerror(err)}") from OSError(err, os.strerror(err))
    return ret


def load_device_program(program: bytes, name: str = "gpuslurm_dev") -> int:
    """Load ``program`` as a cgroup device program; its file descriptor (close it when done)."""
    insns = ctypes.create_string_buffer(program, len(program))
    license_ = ctypes.create_string_buffer(b"GPL")
    attr = _LoadAttr(prog_type=BPF_PROG_TYPE_CGROUP_DEVICE, insn_cnt=len(program) // 8,
                     insns=ctypes.addressof(insns), license=ctypes.addressof(license_),
                     prog_name=name.encode()[:15], expected_attach_type=BPF_CGROUP_DEVICE)
    try:
        return _bpf(BPF_PROG_LOAD, attr, "loading the BPF device program")
    except HardwareError as exc:
        if not isinstance(exc.__cause__, OSError) or exc.__cause__.errno != 22:  # EINVAL
            raise
    # The verifier refused it: load again with its log, which says why.
    log = ctypes.create_string_buffer(1 << 16)
    attr.log_level, attr.log_size, attr.log_buf = 1, len(log), ctypes.addressof(log)
    try:
        return _bpf(BPF_PROG_LOAD, attr, "loading the BPF device program")
    except HardwareError:
        lines = log.value.decode(errors="replace").strip().splitlines()
        raise HardwareError(f"the BPF verifier refused the device program: "
                            f"{lines[-1] if lines else 'no log'}") from None


def attach_device_program(cgroup_fd: int, prog_fd: int) -> None:
    """Attach to the cgroup open at ``cgroup_fd``, next to any programs already there."""
    attr = _AttachAttr(target_fd=cgroup_fd, attach_bpf_fd=prog_fd, attach_type=BPF_CGROUP_DEVICE,
                       attach_flags=BPF_F_ALLOW_MULTI)
    _bpf(BPF_PROG_ATTACH, attr, "attaching the BPF device program")


def detach_device_program(cgroup_fd: int, prog_fd: int) -> None:
    attr = _AttachAttr(target_fd=cgroup_fd, attach_bpf_fd=prog_fd, attach_type=BPF_CGROUP_DEVICE)
    _bpf(BPF_PROG_DETACH, attr, "detaching the BPF device program")


def attached_program_ids(cgroup_fd: int) -> tuple[int, ...]:
    """Ids of the device programs attached directly to the cgroup."""
    ids = (ctypes.c_uint32 * 64)()
    attr = _QueryAttr(target_fd=cgroup_fd, attach_type=BPF_CGROUP_DEVICE,
                      prog_ids=ctypes.addressof(ids), prog_cnt=len(ids))
    _bpf(BPF_PROG_QUERY, attr, "querying the cgroup's BPF device programs")
    return tuple(ids[: attr.prog_cnt])


def deny_devices(cgroup_dir: str, denied: Iterable[tuple[int, int]]) -> None:
    """Build, load and attach a program denying ``denied`` to the cgroup v2 directory."""
    program = deny_program(denied)
    cgroup_fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        prog_fd = load_device_program(program)
        try:
            attach_device_program(cgroup_fd, prog_fd)
        finally:
            os.close(prog_fd)
    finally:
        os.close(cgroup_fd)
