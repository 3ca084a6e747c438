"""Which NVML C entry points a process calls, seen at the real pynvml's one door to the library.

nvidia-ml-py resolves every C function through ``pynvml._nvmlGetFunctionPointer(name)``, and
gpuslurm's own process-list reader goes through it too. :data:`COUNTING` is Python source a test
prepends to the code it runs on a live node (``LiveNode.python``): it wraps that function so each
lookup is recorded in ``LOOKUPS`` and each call into the replay library in ``CALLS`` as
``[C name, [argument values]]`` (numbers as numbers, device handles as their address,
buffers and other pointers as None). The names
are the library's exported symbols (``nvmlInitWithFlags``, ``nvmlDeviceGetCount_v2``, ...), so a
count is what crossed the C ABI, not what a stand-in chose to log.

It runs in the child process only: a test process that loaded the replay library would hand it
to every later ``CDLL("libnvidia-ml.so.1")`` in that process (the loader matches the soname).
"""

from __future__ import annotations

COUNTING = '''
import ctypes as _ctypes
import pynvml as _pynvml
CALLS = []
LOOKUPS = []


def _plain(arg):
    if isinstance(arg, _ctypes._Pointer):  # a handle: its address, as handle() gives it
        return _ctypes.cast(arg, _ctypes.c_void_p).value
    value = getattr(arg, "value", arg)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class _Counted:
    __slots__ = ("_name", "_fn")

    def __init__(self, name, fn):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_fn", fn)

    def __call__(self, *args):
        CALLS.append([self._name, [_plain(a) for a in args]])
        return self._fn(*args)

    def __getattr__(self, attr):
        return getattr(self._fn, attr)

    def __setattr__(self, attr, value):  # restype, argtypes: the ctypes function's own
        setattr(self._fn, attr, value)


_lookup = _pynvml._nvmlGetFunctionPointer


def _counting(name):
    LOOKUPS.append(name)
    return _Counted(name, _lookup(name))


_pynvml._nvmlGetFunctionPointer = _counting


def handle(index):
    """The address of GPU ``index``'s handle, as CALLS records handle arguments."""
    return _plain(_pynvml.nvmlDeviceGetHandleByIndex(index))


def called(prefix, since=0):
    """The calls from index ``since`` on whose C name starts with ``prefix``."""
    return [c for c in CALLS[since:] if c[0].startswith(prefix)]
'''
