"""Whether root may trust a path: owner and mode checks on what the hooks run or read as root.

``gpuslurm install`` refuses a destination, an interpreter (its whole ``sys.path``), a config
file, a capture bundle or a throttle file that a user other than root could change, before it
writes a hook that root runs on every job from there.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from gpuslurm.errors import CommandError, InputError


def check_trusted_dir(path: Path, what: str = "") -> None:
    """Refuse a destination (or a source of code) another user could change: root runs it.

    safedir's rule for every existing directory on the path, as given and resolved: owned by root
    (or us), and not writable by group or others; a directory above the last one may be writable
    by others only if it is sticky and root's (``/tmp``: nobody else can rename what root made).
    A group member who can write a directory can rename it and plant a hook in its place.
    """
    seen: set[Path] = set()
    for top in dict.fromkeys((Path(os.path.abspath(path)), path.resolve())):
        for d in (top, *top.parents):
            if d in seen:
                continue
            seen.add(d)
            try:
                st = os.stat(d)
            except FileNotFoundError:
                continue
            why = unsafe_reason(st, final=d == top)
            if why:
                raise InputError(f"{d} {why}; root must not run or read {what or 'hooks'} from there", path)


def check_throttle_file(path: Path) -> None:
    """Refuse a throttle file job_submit.lua could hang on: Lua 5.1 cannot stat, and ``io.open``
    of a FIFO blocks slurmctld. The plugin's defence is a directory only root can write (checked
    here, as every ``gpuslurm throttle`` command checks it) holding nothing but a regular file."""
    path = Path(os.path.abspath(path))
    check_trusted_dir(path.parent, "the throttle file job_submit.lua opens in slurmctld")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a symlink" if stat.S_ISLNK(st.st_mode)
                else "not a regular file")
        raise InputError(f"is {kind}: job_submit.lua would open it inside slurmctld (a FIFO blocks "
                         "it); remove it", path)


def unsafe_reason(st: os.stat_result, *, final: bool) -> str | None:
    """Why a directory or file with ``st`` could be changed by another user; None if it cannot."""
    if st.st_uid not in (0, os.geteuid()):
        return f"is owned by uid {st.st_uid}"
    if not st.st_mode & 0o022:
        return None
    if not final and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_uid == 0:
        return None
    if st.st_mode & stat.S_IWOTH:
        return "is writable by every user"
    import grp

    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"is writable by group {group} (mode {stat.S_IMODE(st.st_mode):04o})"


# Run with -S: site's .pth files are listed, not executed, before they are checked. Without
# site, a venv's prefix is found as site.venv() would (pyvenv.cfg beside or above the binary).
# Debian's site.getsitepackages names a venv's lib/pythonX.Y/site-packages only once sys.prefix
# is the venv, which site.venv() sets and -S skips: without it, the site-packages of every venv
# made from Debian's python3 went unchecked. Both views are taken, so nothing is left out.
_CODE_PATHS = """
import json, os, site, sys
exe_dir = os.path.dirname(os.path.abspath(sys.executable))
prefixes = [sys.prefix]
sites = site.getsitepackages(prefixes)
if any(os.path.isfile(os.path.join(d, "pyvenv.cfg")) for d in (exe_dir, os.path.dirname(exe_dir))):
    prefixes.insert(0, os.path.dirname(exe_dir))
    sys.prefix = sys.exec_prefix = prefixes[0]
    sites += site.getsitepackages(prefixes)
sys.stdout.write(json.dumps({"path": [p for p in sys.path if p], "site": list(dict.fromkeys(sites))}))
"""


# The most directory entries check_interpreter walks before it refuses: a distribution's stdlib
# and site-packages hold well under this; an unbounded tree must not hang install.
MAX_CODE_ENTRIES = 500_000


def check_interpreter(python: str) -> None:
    """Refuse an interpreter whose code another user could change: the interpreter file itself
    (every symlink on the way to it), every entry of its ``sys.path`` (run with ``-I`` as the
    hooks are), its site-packages, every ``.pth`` file there and the directories they add, and
    every directory and file inside all of those; all of it runs as root in every hook."""
    from gpuslurm.runner import run_command

    check_trusted_dir(Path(python).parent, "the interpreter")
    check_trusted_dir(Path(python).resolve().parent, "the interpreter")
    _check_link_chain(Path(python))
    try:
        out = run_command([python, "-I", "-S", "-c", _CODE_PATHS], env={}, timeout=60).stdout
        doc = json.loads(out)
        entries = [str(p) for p in doc["path"]]
        sites = [str(p) for p in doc["site"]]
    except (CommandError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"cannot import gpuslurm: not a working interpreter ({exc})", python) from None
    pth_files = []
    for site_dir in sites:
        try:
            names = sorted(os.listdir(site_dir))
        except OSError:
            continue
        entries.append(site_dir)
        pth_files += [Path(site_dir) / n for n in names if n.endswith(".pth")]
    for pth in pth_files:
        _check_code_file(pth)
        entries += _pth_dirs(pth)
    roots = []
    for entry in entries:
        p = Path(entry)
        if not p.exists():
            continue
        check_trusted_dir(p if p.is_dir() else p.parent, "code")
        if p.is_dir():
            roots.append(p)
        else:
            _check_link_chain(p)
    _check_code_trees(roots)


def check_code_dirs(dirs: list[str]) -> None:
    """Refuse code directories another user could change: each directory, the path to it, and
    everything under it (as check_interpreter checks the interpreter's own ``sys.path``)."""
    roots = []
    for entry in dirs:
        p = Path(entry)
        check_trusted_dir(p if p.is_dir() else p.parent, "code")
        if p.is_dir():
            roots.append(p)
    _check_code_trees(roots)


def _check_link_chain(path: Path) -> Path:
    """Check ``path`` and, if it is a symlink, every link on the way to its target and the
    directories holding them; return the final target. A dangling link is refused: whoever can
    create its target would choose the code."""
    path = Path(os.path.abspath(path))
    for _ in range(40):
        check_trusted_dir(path.parent, "code")
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise InputError("is a symlink to a missing file; root would run whatever appears "
                             "there in every hook", path) from None
        if not stat.S_ISLNK(st.st_mode):
            why = unsafe_reason(st, final=True)
            if why:
                raise InputError(f"{why}; root runs it in every hook", path)
            return path
        path = Path(os.path.abspath(os.path.join(path.parent, os.readlink(path))))
    raise InputError("too many levels of symbolic links", path)


def _check_code_trees(roots: list[Path]) -> None:
    """Every directory and file under ``roots``, symlinks not followed (lstat): owned by root or
    us and not writable by group or others. A symlink is checked by its target's rule; a
    symlinked directory is walked in turn. At most MAX_CODE_ENTRIES entries in all."""
    done: set[str] = set()
    queue = list(roots)
    count = 0
    while queue:
        top = os.path.realpath(queue.pop(0))
        if any(top == d or top.startswith(d.rstrip("/") + "/") for d in done):
            continue
        done.add(top)
        for here, dirs, files in os.walk(top, followlinks=False, onerror=_walk_error):
            for name in (*dirs, *files):
                count += 1
                if count > MAX_CODE_ENTRIES:
                    raise InputError(f"more than {MAX_CODE_ENTRIES} files and directories to check "
                                     "on the interpreter's path; pick a smaller installation", top)
                path = Path(here) / name
                st = os.lstat(path)
                if stat.S_ISLNK(st.st_mode):
                    target = _check_link_chain(path)
                    if target.is_dir():
                        queue.append(target)
                    continue
                why = unsafe_reason(st, final=True)
                if why:
                    raise InputError(f"{why}; root runs the code under it in every hook", path)


def _walk_error(exc: OSError) -> None:
    raise InputError(f"cannot check the code there ({exc.strerror})", exc.filename or "") from None


def _pth_dirs(pth: Path) -> list[str]:
    """The directories a ``.pth`` file adds to ``sys.path`` (its import lines run code from them)."""
    try:
        lines = pth.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [os.path.join(pth.parent, line.rstrip()) for line in lines
            if line.strip() and not line.startswith(("#", "import ", "import\t"))]


def _check_code_file(path: Path) -> None:
    st = os.lstat(path)
    why = "is a symlink" if stat.S_ISLNK(st.st_mode) else unsafe_reason(st, final=True)
    if why:
        raise InputError(f"{why}; root runs it in every hook", path)


def check_config_path(config: str) -> None:
    """Refuse a config path the hooks must not read as root: not absolute, holding a line break,
    not a regular file (a symbolic link is refused), or one that another user could change
    (the file, or any directory on its path, by :func:`check_trusted_dir`'s rule)."""
    if not os.path.isabs(config) or "\n" in config or os.path.normpath(config) != config:
        raise InputError("--config must be an absolute, normalised path", config)
    try:
        st = os.lstat(config)
    except FileNotFoundError:
        raise InputError("no such file (write the config first)", config) from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError("is not a regular file (a symbolic link?); the hooks read it as root", config)
    why = unsafe_reason(st, final=True)
    if why:
        raise InputError(f"{why}; root must not read configuration from there", config)
    check_trusted_dir(Path(config).parent, "configuration")
