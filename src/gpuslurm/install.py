"""``gpuslurm install``: put the hook executables and the cgroup.conf snippet in place.

Planning is separate from doing: :func:`plan_install` looks at the destination and decides one
action per file; :func:`apply_plan` carries the actions out. A manifest beside the hooks records
the sha256 of every file gpuslurm wrote, so a file whose content differs from that record was
edited by an admin and is left alone unless ``force``. Writes are atomic (temporary file and
rename) and never go through a symbolic link.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import shlex
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuslurm.errors import CommandError, InputError
from gpuslurm.trust import check_code_dirs, check_config_path, check_interpreter, check_trusted_dir

DEFAULT_PREFIX = Path("/usr/local/libexec/gpuslurm")
MANIFEST_NAME = "install-manifest.json"
CGROUP_SNIPPET_NAME = "gpuslurm-cgroup.conf"
PLACEHOLDER = "@PYTHON@"
SYS_PATH_PLACEHOLDER = "@SYSPATH@"  # the hooks' own sys.path entries (they start with -I -S)
CONFIG_VAR = "GPUSLURM_CONFIG"  # gpuslurm.configfile.ENV_VAR, not imported: install stays light
CAPTURE_VAR = "GPUSLURM_CAPTURE"  # gpuslurm.hw.source.ENV_VAR
SOCKET_VAR = "GPUSLURM_HOOK_SOCKET"  # gpuslurm.slurm.hookclient.SOCKET_VAR
SERVED_HOOKS = ("gpuslurm-prolog", "gpuslurm-epilog")  # the hook server's clients (hookclient.SERVED)
CLIENT_MODULE = "gpuslurm.slurm.hookclient"  # what the prolog's and epilog's templates start
ENTRY_MODULE = "gpuslurm.slurm.entry"  # the hooks themselves
MANIFEST_FORMAT = 1

# Installed name -> (template folder, slurm.conf key).
HOOKS: dict[str, tuple[str, str]] = {
    "gpuslurm-prolog": ("prolog", "Prolog"),
    "gpuslurm-epilog": ("epilog", "Epilog"),
    "gpuslurm-task-prolog": ("prolog", "TaskProlog"),
}

# The hook server's client in C (`install --c-client`): built from this source with the node's cc.
C_CLIENT = "gpuslurm-hook-client"
C_CLIENT_SOURCE = Path(__file__).resolve().parent / "slurm" / "hookclient.c"
CC = "/usr/bin/cc"
CC_FLAGS = ("-O2", "-Wall", "-Wextra")  # no -Werror: a newer compiler's new warning must not stop install

# slurm.conf's HealthCheckProgram (`install --health-check`): installed like the hooks, not a hook.
HEALTH_CHECK = "gpuslurm-health-check"
HEALTH_CHECK_INTERVAL_S = 300

CGROUP_SNIPPET = """\
# cgroup.conf settings gpuslurm relies on (written by `gpuslurm install`).
# Slurm reads only cgroup.conf itself: copy these lines into it.
# ConstrainDevices confines each job to the /dev/nvidia* files of the GPUs it was given;
# ConstrainCores keeps its tasks on the cores gres.conf's Cores= made close to those GPUs.
ConstrainDevices=yes
ConstrainCores=yes
"""


@dataclass(frozen=True, slots=True)
class Artifact:
    """One file install wants on disk."""

    path: Path
    content: bytes
    mode: int

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()


@dataclass(frozen=True, slots=True)
class FileState:
    """What is at a destination now; ``kind`` is missing, file, symlink or other."""

    kind: str
    content: bytes = b""
    mode: int = 0
    uid: int = -1


@dataclass(frozen=True, slots=True)
class Action:
    """``verb``: create, update (ours, out of date), overwrite (admin's, --force), fix-mode,
    keep, or conflict / refuse (nothing may be done)."""

    artifact: Artifact
    verb: str
    old: bytes = b""
    reason: str = ""

    @property
    def changes(self) -> bool:
        return self.verb in ("create", "update", "overwrite", "fix-mode")


@dataclass(frozen=True, slots=True)
class InstallPlan:
    prefix: Path
    slurm_etc: Path
    manifest_path: Path
    manifest: dict[str, str]  # path -> sha256, as it will be after apply
    manifest_changes: bool
    new_dirs: tuple[Path, ...]
    actions: tuple[Action, ...]
    python: str
    config: str = ""  # the config path baked into the hooks; empty: their built-in default
    capture: str = ""  # a capture bundle the hooks replay instead of NVML (test clusters, demos)
    sys_path: tuple[str, ...] = ()  # gpuslurm's and its dependencies' directories (hook_sys_path)

    @property
    def changes(self) -> bool:
        return bool(self.new_dirs) or self.manifest_changes or any(a.changes for a in self.actions)

    def hook_path(self, key: str) -> Path:
        name = next(n for n, (_, k) in HOOKS.items() if k == key)
        return self.prefix / name


# --- pure parts ------------------------------------------------------------------------------


def render_hook(template: str, python: str, source: str = "<template>", config: str = "",
                capture: str = "", sys_path: Sequence[str] = (), socket: str = "",
                client: tuple[str, str] = ("", "")) -> str:
    """The hook script: ``template`` with its one placeholder replaced by the quoted interpreter,
    and, given a ``config`` path (or a ``capture`` bundle to replay), ``GPUSLURM_CONFIG`` (or
    ``GPUSLURM_CAPTURE``) set to it just before the ``exec`` line. A template that starts Python
    with ``-S`` holds ``@SYSPATH@`` once, inside its single-quoted ``-c`` program: it becomes the
    list ``sys_path`` (:func:`hook_sys_path`), which must then not be empty.

    Slurm passes the hooks only the job's variables, so a config path other than the default
    reaches them only this way: written into the executable root runs. So does ``socket``, the hook
    server's (``GPUSLURM_HOOK_SOCKET``), for a config whose run_dir is not the default.
    ``client``: (the C client's path, the hook's name): the exec line starts that client, with the
    Python hook (``gpuslurm.slurm.entry``, not the Python client) as what it runs when the server
    does not answer.
    """
    if template.count(PLACEHOLDER) != 1:
        raise InputError(f"hook template must contain {PLACEHOLDER} exactly once", source)
    if client[0]:
        started = f"\nexec {PLACEHOLDER} "
        if template.count(started) != 1:
            raise InputError("hook template must have exactly one exec line", source)
        template = template.replace(started, f"\nexec {shlex.quote(client[0])} {client[1]} {PLACEHOLDER} ")
        # what the C client runs when the server does not answer: the hook itself, not the
        # Python client (which would ask the server a second time)
        template = template.replace(f"from {CLIENT_MODULE} import run", f"from {ENTRY_MODULE} import run")
    text = template.replace(PLACEHOLDER, shlex.quote(python))
    if SYS_PATH_PLACEHOLDER in text:
        if text.count(SYS_PATH_PLACEHOLDER) != 1 or not sys_path:
            raise InputError(f"hook template holds {SYS_PATH_PLACEHOLDER} more than once, or no "
                             "directories were given for it", source)
        text = text.replace(SYS_PATH_PLACEHOLDER, sys_path_literal(sys_path))
    baked = "".join(f"{var}={shlex.quote(value)}\nexport {var}\n"
                    for var, value in ((CONFIG_VAR, config), (CAPTURE_VAR, capture), (SOCKET_VAR, socket))
                    if value)
    if baked:
        if text.count("\nexec ") != 1:
            raise InputError("hook template must have exactly one exec line", source)
        text = text.replace("\nexec ", f"\n{baked}exec ")
    return text


def sys_path_literal(sys_path: Sequence[str]) -> str:
    """``sys_path`` as a Python list literal that can stand inside a single-quoted sh word: JSON
    strings (ASCII, escaped) are Python strings; a directory holding ``'`` (which would end the sh
    word) or a control character, or one not absolute, is an InputError."""
    for path in sys_path:
        if not os.path.isabs(path) or "'" in path or not path.isprintable():
            raise InputError("cannot be written into a hook's sys.path (not absolute, or it holds "
                             "a quote or a control character)", path)
    return json.dumps(list(sys_path))


def slurm_conf_lines(prefix: Path, mps: bool = False) -> list[str]:
    """The slurm.conf lines that make Slurm run the installed hooks."""
    lines = [f"{key}={prefix / name}" for name, (_, key) in HOOKS.items()]
    lines.append("PrologFlags=Alloc,Contain")
    lines.append("GresTypes=gpu,mps" if mps else "GresTypes=gpu")
    return lines


def health_check_lines(prefix: Path, interval_s: int = HEALTH_CHECK_INTERVAL_S) -> list[str]:
    """The slurm.conf lines that make slurmd run ``gpuslurm health --act`` (the installed wrapper):
    every ``interval_s`` seconds, on the node in any state (a drained node is still checked, so a
    GPU that failed while it drained is still taken out)."""
    return [f"HealthCheckProgram={prefix / HEALTH_CHECK}", f"HealthCheckInterval={interval_s}",
            "HealthCheckNodeState=ANY"]


def parse_slurm_conf(text: str) -> dict[str, str]:
    """``Key=value`` settings of a slurm.conf (keys lower-cased; the last one wins)."""
    settings: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.lower().startswith(("nodename=", "partitionname=", "include ")):
            continue
        for word in line.split():
            key, sep, value = word.partition("=")
            if sep:
                settings[key.lower()] = value
    return settings


def conf_status(wanted: Sequence[str], settings: Mapping[str, str]) -> list[str]:
    """One note per wanted line that the existing slurm.conf does not already satisfy."""
    notes = []
    for line in wanted:
        key, _, value = line.partition("=")
        have = settings.get(key.lower())
        if key in ("PrologFlags", "GresTypes"):
            missing = _missing_items(value, have or "")
            if missing:
                now = f" (now {key}={have})" if have is not None else ""
                notes.append(f"{key} lacks {','.join(missing)}{now}")
        elif have is None:
            notes.append(f"{key} is not set")
        elif have != value:
            notes.append(f"{key}={have} is set, not {value}")
    return notes


def _missing_items(want: str, have: str) -> list[str]:
    present = {item.strip().lower() for item in have.split(",")}
    return [item for item in want.split(",") if item.lower() not in present]


def decide(artifact: Artifact, state: FileState, recorded: str | None, force: bool,
           want_uid: int | None) -> Action:
    """What to do with one destination, given what is there and what the manifest recorded."""
    if state.kind == "missing":
        return Action(artifact, "create")
    if state.kind == "symlink":
        return Action(artifact, "refuse", reason="is a symbolic link; install does not follow links "
                      "(remove it and run again)")
    if state.kind != "file":
        return Action(artifact, "refuse", reason="exists and is not a regular file")
    current = hashlib.sha256(state.content).hexdigest()
    if current == artifact.sha256:
        wrong_owner = want_uid is not None and state.uid != want_uid
        if stat.S_IMODE(state.mode) != artifact.mode or wrong_owner:
            return Action(artifact, "fix-mode", state.content)
        return Action(artifact, "keep", state.content)
    if recorded == current:
        return Action(artifact, "update", state.content)
    if force:
        return Action(artifact, "overwrite", state.content)
    why = ("was changed since gpuslurm installed it" if recorded is not None
           else "exists and was not written by gpuslurm install")
    return Action(artifact, "conflict", state.content, f"{why}; use --force to overwrite it")


def describe(plan: InstallPlan, dry_run: bool) -> list[str]:
    """One line per change (or a single line saying there is nothing to change)."""
    would = "would " if dry_run else ""
    words = {"create": "create", "update": "update", "overwrite": "overwrite (edited by admin)",
             "fix-mode": "fix owner/mode of"}
    lines = [f"{would}create directory {d}" for d in plan.new_dirs]
    lines += [f"{would}{words[a.verb]} {a.artifact.path}" for a in plan.actions if a.changes]
    if plan.manifest_changes:
        lines.append(f"{would}record {len(plan.manifest)} files in {plan.manifest_path}")
    if not lines:
        lines.append(f"nothing to change: {len(plan.actions)} files already installed "
                     f"(manifest {plan.manifest_path})")
    return lines


def diff(action: Action) -> str:
    """A unified diff from what is on disk to what install writes (for the built client, one line)."""
    if action.artifact.path.name == C_CLIENT:
        return (f"{action.artifact.path}: built from {C_CLIENT_SOURCE.name}, "
                f"{len(action.artifact.content)} bytes, sha256 {action.artifact.sha256[:12]}\n")
    old = action.old.decode("utf-8", "replace").splitlines(keepends=True)
    new = action.artifact.content.decode("utf-8", "replace").splitlines(keepends=True)
    before = "/dev/null" if action.verb == "create" else str(action.artifact.path)
    return "".join(difflib.unified_diff(old, new, before, str(action.artifact.path)))


# --- the file system -------------------------------------------------------------------------


def template_text(name: str) -> tuple[str, Path]:
    """A hook template from the installed package, else from the source checkout."""
    folder = HOOKS[name][0] if name in HOOKS else "prolog"  # the health check's sits beside the prolog
    here = Path(__file__).resolve().parent
    for base in (here / "hook-templates", here.parents[1]):
        path = base / folder / name
        if path.is_file():
            return path.read_text(), path
    raise InputError("hook template not found (broken installation?)", f"{folder}/{name}")


def desired_files(prefix: Path, slurm_etc: Path, python: str, config: str = "",
                  capture: str = "", health_check: bool = False,
                  sys_path: Sequence[str] = (), socket: str = "", c_client: bytes = b"") -> list[Artifact]:
    """The hooks (0755) and the cgroup.conf snippet (0644), rendered for this interpreter and its
    ``sys_path`` (and config path, when one is given); with ``health_check``, the
    HealthCheckProgram wrapper too. ``socket``: the hook server's, written into the prolog and the
    epilog (:func:`hook_socket`); ``c_client``: the built C client (:func:`build_c_client`), installed
    beside them and started by the prolog and the epilog."""
    files = []
    for name in (*HOOKS, *((HEALTH_CHECK,) if health_check else ())):
        text, source = template_text(name)
        served = name in SERVED_HOOKS
        client = (str(prefix / C_CLIENT), HOOKS[name][0]) if served and c_client else ("", "")
        rendered = render_hook(text, python, str(source), config, capture, sys_path,
                               socket if served else "", client)
        files.append(Artifact(prefix / name, rendered.encode(), 0o755))
    if c_client:
        files.append(Artifact(prefix / C_CLIENT, c_client, 0o755))
    files.append(Artifact(slurm_etc / CGROUP_SNIPPET_NAME, CGROUP_SNIPPET.encode(), 0o644))
    return files


def inspect(path: Path) -> FileState:
    """What is at ``path``, without following a symbolic link there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return FileState("missing")
    if stat.S_ISLNK(st.st_mode):
        return FileState("symlink")
    if not stat.S_ISREG(st.st_mode):
        return FileState("other")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        return FileState("file", fh.read(), st.st_mode, st.st_uid)


def read_manifest(path: Path) -> dict[str, str]:
    """path -> sha256 of every file a previous install wrote; empty when there is none."""
    state = inspect(path)
    if state.kind == "missing":
        return {}
    if state.kind != "file":
        raise InputError("manifest is not a regular file (a symbolic link?)", path)
    try:
        data = json.loads(state.content)
        files = data["files"]
        if data.get("format") != MANIFEST_FORMAT or not isinstance(files, dict):
            raise ValueError("unknown format")
        return {str(k): str(v) for k, v in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise InputError("manifest does not parse; move it away to start afresh", path) from None


def missing_dirs(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet, outermost first."""
    out = []
    for d in (path, *path.parents):
        if os.path.lexists(d):
            if not d.is_dir():
                raise InputError("exists and is not a directory", d)
            break
        out.append(d)
    return out[::-1]


def plan_install(slurm_etc: Path, prefix: Path = DEFAULT_PREFIX, python: str = "",
                 force: bool = False, config: str = "", capture: str = "",
                 health_check: bool = False, c_client: bool = False) -> InstallPlan:
    """Decide every action; raise InputError (naming the file) if any destination must be left alone."""
    python = python or os.path.abspath(sys.executable)
    prefix = Path(os.path.abspath(prefix))
    slurm_etc = Path(os.path.abspath(slurm_etc))
    if not os.path.isabs(python) or "\n" in python:
        raise InputError("the interpreter must be an absolute path", python)
    if any(c.isspace() for c in str(prefix)):
        raise InputError("slurm.conf cannot name a hook whose path holds white space", prefix)
    if not slurm_etc.is_dir():
        raise InputError("no such directory", slurm_etc)
    check_trusted_dir(slurm_etc, "configuration")
    check_trusted_dir(prefix)
    if config:
        check_config_path(config)
    if capture:
        if not os.path.isabs(capture) or "\n" in capture or not os.path.isdir(capture):
            raise InputError("--replay must name an existing directory by its absolute path", capture)
        check_trusted_dir(Path(capture), "a capture bundle")
    manifest_path = prefix / MANIFEST_NAME
    recorded = read_manifest(manifest_path)
    want_uid = 0 if os.geteuid() == 0 else None
    check_interpreter(python)  # before running it as root
    sys_path = hook_sys_path(python)
    check_code_dirs(sys_path)  # written into root's hooks: an import-line finder's directory too
    actions = [decide(a, inspect(a.path), recorded.get(str(a.path)), force, want_uid)
               for a in desired_files(prefix, slurm_etc, python, config, capture, health_check, sys_path,
                                      hook_socket(config), build_c_client() if c_client else b"")]
    blocked = [a for a in actions if a.verb in ("conflict", "refuse")]
    if blocked:
        more = f" (and {len(blocked) - 1} more)" if len(blocked) > 1 else ""
        raise InputError(blocked[0].reason + more, blocked[0].artifact.path)
    manifest = {**recorded, **{str(a.artifact.path): a.artifact.sha256 for a in actions}}
    return InstallPlan(prefix, slurm_etc, manifest_path, manifest, manifest != recorded,
                       tuple(missing_dirs(prefix)), tuple(actions), python, config, capture,
                       tuple(sys_path))


def build_c_client() -> bytes:
    """The hook server's C client (``slurm/hookclient.c``) built with ``/usr/bin/cc``: the
    executable's bytes (the same source and compiler give the same bytes, so a second install
    keeps it)."""
    import tempfile

    from gpuslurm.runner import run_command

    if not os.access(CC, os.X_OK):
        raise InputError("--c-client needs a C compiler there (apt-get install gcc)", CC)
    with tempfile.TemporaryDirectory(prefix="gpuslurm-c-client-") as tmp:
        out = os.path.join(tmp, C_CLIENT)
        try:
            # root's environment (CPATH, GCC_EXEC_PREFIX, ...) does not choose the toolchain
            run_command([CC, *CC_FLAGS, "-o", out, str(C_CLIENT_SOURCE)], env={"PATH": "/usr/bin:/bin"},
                        timeout=120)
        except CommandError as exc:
            raise InputError(f"cannot build the hook client: {exc}", str(C_CLIENT_SOURCE)) from None
        with open(out, "rb") as built:
            return built.read()


def hook_socket(config: str) -> str:
    """The hook server's socket for the hooks of ``config`` (``hooks.sock`` in its run_dir, where
    ``gpuslurm hook-server`` listens); empty for the default run_dir, which the client knows."""
    if not config:
        return ""
    from gpuslurm.config import load_config
    from gpuslurm.configfile import DEFAULT_RUN_DIR

    run_dir = load_config(config).paths.run_dir
    if os.path.normpath(run_dir) == DEFAULT_RUN_DIR:
        return ""
    if not os.path.isabs(run_dir) or not run_dir.isprintable():
        raise InputError("[paths] run_dir must be an absolute path without control characters", config)
    return os.path.join(run_dir, "hooks.sock")


def atomic_write(path: Path, content: bytes, mode: int) -> None:
    """Replace ``path`` atomically with ``content``, mode exactly ``mode`` (see
    :func:`gpuslurm.safedir.replace_file`); made by root, it is root's."""
    from gpuslurm.safedir import replace_file

    replace_file(str(path), content, mode)


def _own(fd: int, mode: int) -> None:
    if os.geteuid() == 0:
        os.fchown(fd, 0, 0)
    os.fchmod(fd, mode)


def apply_plan(plan: InstallPlan) -> None:
    """Carry out the plan's actions, then record what was written in the manifest."""
    try:
        for d in plan.new_dirs:
            os.mkdir(d, 0o755)
            # Not left to the umask: the TaskProlog runs as the job's user and must reach the hooks.
            os.chmod(d, 0o755)  # noqa: S103
        for action in plan.actions:
            art = action.artifact
            if action.verb in ("create", "update", "overwrite"):
                atomic_write(art.path, art.content, art.mode)
            elif action.verb == "fix-mode":
                fd = os.open(art.path, os.O_RDONLY | os.O_NOFOLLOW)
                try:
                    _own(fd, art.mode)
                finally:
                    os.close(fd)
        if plan.manifest_changes:
            doc = {"format": MANIFEST_FORMAT, "python": plan.python, "files": plan.manifest}
            atomic_write(plan.manifest_path, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode(),
                         0o644)
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror}", exc.filename or plan.prefix) from None


def probe_interpreter(python: str) -> str:
    """Where ``python -I`` imports gpuslurm from, run as Slurm runs hooks (empty environment)."""
    from gpuslurm.runner import run_command

    code = "import gpuslurm, sys; sys.stdout.write(gpuslurm.__file__)"
    try:
        result = run_command([python, "-I", "-c", code], env={}, timeout=60)
    except CommandError as exc:
        raise InputError(f"cannot import gpuslurm with -I and no environment, so the hooks would "
                         f"fail ({exc}); install gpuslurm into it or pick another with --python",
                         python) from None
    return str(Path(result.stdout.strip()).resolve().parent)


# Run by the hooks' interpreter (-I, no environment): the directory gpuslurm imports from, then the
# one of each installed distribution gpuslurm requires, transitively (extras left out), and
# pynvml's (the one dependency the hooks import) where no metadata names it.
_SYS_PATH_PROBE = """
import gpuslurm, importlib.metadata as md, importlib.util, json, os, re, sys
dirs = [os.path.dirname(os.path.dirname(os.path.realpath(gpuslurm.__file__)))]
todo, seen = ["gpuslurm"], set()
while todo:
    name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
    if name in seen:
        continue
    seen.add(name)
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    if name != "gpuslurm":
        dirs.append(os.path.realpath(str(dist.locate_file(""))))
    for req in dist.requires or ():
        if "extra" not in req.partition(";")[2]:
            todo.append(re.match(r"[A-Za-z0-9._-]+", req).group(0))
spec = importlib.util.find_spec("pynvml")
if spec is not None and spec.origin:
    dirs.append(os.path.dirname(os.path.realpath(spec.origin)))
sys.stdout.write(json.dumps(list(dict.fromkeys(d for d in dirs if os.path.isdir(d)))))
"""


def hook_sys_path(python: str) -> list[str]:
    """The directories the hooks put on ``sys.path`` themselves: they start with ``-I -S`` (no
    ``site``, so no site-packages and none of its ``.pth`` start-up code), so gpuslurm's and its
    dependencies' directories, as ``python -I`` finds them with an empty environment, are written
    into the executables. Checked: ``python -I -S`` with them imports the hooks' entry point."""
    from gpuslurm.runner import run_command

    try:
        found = run_command([python, "-I", "-c", _SYS_PATH_PROBE], env={}, timeout=60)
        dirs = json.loads(found.stdout)
        if not isinstance(dirs, list) or not dirs or not all(isinstance(d, str) for d in dirs):
            raise ValueError(f"not a list of directories: {found.stdout[:200]!r}")
        literal = sys_path_literal(dirs)
        run_command([python, "-I", "-S", "-c",
                     f"import sys; sys.path += {literal}; import gpuslurm.slurm.entry"],
                    env={}, timeout=60)
    except (CommandError, ValueError) as exc:
        raise InputError(f"cannot import gpuslurm and find its dependencies' directories with -I "
                         f"and no environment, so the hooks would fail ({exc}); install gpuslurm "
                         f"into it or pick another with --python", python) from None
    return dirs


def unreachable_by_users(path: Path) -> Path | None:
    """The first part of ``path`` other users cannot reach (the TaskProlog runs as the job's user)."""
    for p in dict.fromkeys((*reversed(path.parents), path, *reversed(path.resolve().parents),
                            path.resolve())):
        try:
            if not os.stat(p).st_mode & stat.S_IXOTH:
                return p
        except FileNotFoundError:  # not made yet: install creates directories 0755
            return None
    return None
