"""``gpuslurm install`` into temporary directories: real files, real hooks run with no PATH."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from tests.helpers.install_helpers import ok, run

import gpuslurm
from gpuslurm import install as lib
from gpuslurm import trust
from gpuslurm.cli.install_cmd import install
from gpuslurm.cli.main import cli
from gpuslurm.errors import EXIT_BAD_INPUT, InputError

HOOK_NAMES = ("gpuslurm-prolog", "gpuslurm-epilog", "gpuslurm-task-prolog")
# What the installed hooks exec: the hooks' own entry point, not the click CLI.
# Where this interpreter's gpuslurm and its dependencies are (an editable install: the source
# folder, then site-packages), which install writes into the hooks they start with -I -S.
# (Not this venv's purelib: where the venv's .pth names another site-packages, as the Python
# matrix's does, the dependencies live there.) What the probe finds is checked on its own below.
HOOK_DIRS = lib.hook_sys_path(sys.executable)
HOOK_CODE = f"'import sys; sys.path += {json.dumps(HOOK_DIRS)}; from gpuslurm.slurm.entry import run; run()'"
# The prolog and the epilog start as clients of the hook server (which run the hook themselves
# when it is not there); the task prolog runs as the job's user and starts the hook directly.
CLIENT_CODE = HOOK_CODE.replace("gpuslurm.slurm.entry", "gpuslurm.slurm.hookclient")


def refused(result: Result) -> InputError:
    # main() turns an InputError into "gpuslurm: <its str>" on stderr and exit code 2.
    assert isinstance(result.exception, InputError), (result.output, result.exception)
    assert result.exception.exit_code == EXIT_BAD_INPUT
    assert "\n" not in str(result.exception)
    return result.exception


def snapshot(*paths: Path) -> dict[Path, tuple[int, int, int, bytes]]:
    out = {}
    for p in paths:
        st = os.lstat(p)
        out[p] = (st.st_ino, st.st_mtime_ns, st.st_mode, p.read_bytes() if p.is_file() else b"")
    return out


def test_first_install_writes_hooks_snippet_and_manifest(dirs: tuple[Path, Path]) -> None:
    etc, prefix = dirs
    out = ok(run(etc, prefix))
    for name in installed_files(etc, prefix):
        assert f"create {name}" in out
    for name in HOOK_NAMES:
        hook = prefix / name
        assert stat.S_IMODE(hook.stat().st_mode) == 0o755
        assert hook.read_text().startswith("#!/bin/sh\n")
        command = name.removeprefix("gpuslurm-")
        code = HOOK_CODE if command == "task-prolog" else CLIENT_CODE
        assert f'exec {sys.executable} -I -S -c {code} {command} "$@"' in hook.read_text()
        assert hook.stat().st_uid == os.geteuid()
    assert stat.S_IMODE(prefix.stat().st_mode) == 0o755
    snippet = etc / lib.CGROUP_SNIPPET_NAME
    assert "ConstrainDevices=yes" in snippet.read_text().splitlines()
    assert stat.S_IMODE(snippet.stat().st_mode) == 0o644
    assert not (etc / "cgroup.conf").exists()  # the admin's own file is never written
    manifest = json.loads((prefix / lib.MANIFEST_NAME).read_text())
    for path in installed_files(etc, prefix):
        assert manifest["files"][str(path)] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert not [p for p in prefix.iterdir() if ".tmp" in p.name]


def installed_files(etc: Path, prefix: Path) -> list[Path]:
    return [prefix / n for n in HOOK_NAMES] + [etc / lib.CGROUP_SNIPPET_NAME]


def test_printed_slurm_conf_lines_have_absolute_paths(dirs: tuple[Path, Path]) -> None:
    etc, prefix = dirs
    lines = ok(run(etc, prefix, "--mps")).splitlines()
    assert f"Prolog={prefix}/gpuslurm-prolog" in lines
    assert f"Epilog={prefix}/gpuslurm-epilog" in lines
    assert f"TaskProlog={prefix}/gpuslurm-task-prolog" in lines
    assert "PrologFlags=Alloc,Contain" in lines
    assert "GresTypes=gpu,mps" in lines
    relative = ok(CliRunner().invoke(install, ["--slurm-etc", os.path.relpath(etc),
                                               "--prefix", os.path.relpath(prefix)],
                                     standalone_mode=False))
    assert f"Prolog={prefix}/gpuslurm-prolog" in relative.splitlines()
    assert "GresTypes=gpu" in relative.splitlines()


def test_second_run_changes_nothing_and_says_so(dirs: tuple[Path, Path]) -> None:
    etc, prefix = dirs
    ok(run(etc, prefix))
    paths = [*installed_files(etc, prefix), prefix / lib.MANIFEST_NAME]
    before = snapshot(*paths)
    out = ok(run(etc, prefix))
    assert out.startswith("nothing to change: 4 files already installed")
    assert "create" not in out and "update" not in out
    assert snapshot(*paths) == before


def test_dry_run_shows_diffs_and_changes_nothing(dirs: tuple[Path, Path]) -> None:
    etc, prefix = dirs
    out = ok(run(etc, prefix, "--dry-run"))
    assert f"would create directory {prefix}" in out
    assert f"+++ {prefix}/gpuslurm-prolog" in out
    assert f"+exec {sys.executable} -I -S -c {CLIENT_CODE} prolog" in out
    assert not prefix.parent.exists()
    assert list(etc.iterdir()) == []


def test_new_interpreter_updates_our_files_without_force(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    etc, prefix = dirs
    ok(run(etc, prefix))
    other = tmp_path / "bin" / "python3"
    other.parent.mkdir()
    # The same Python under another path. A wrapper, not a symlink: a symlink to a venv's python
    # placed outside the venv starts the base interpreter, which may not have gpuslurm at all.
    other.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    other.chmod(0o755)
    dry = ok(run(etc, prefix, "--python", str(other), "--dry-run"))
    assert f"-exec {sys.executable} -I" in dry and f"+exec {other} -I" in dry
    assert str(other) not in (prefix / "gpuslurm-prolog").read_text()
    out = ok(run(etc, prefix, "--python", str(other)))
    assert f"update {prefix}/gpuslurm-epilog" in out
    assert f"update {etc}" not in out  # the snippet did not change
    assert f"exec {other} -I -S -c {CLIENT_CODE} epilog" in (prefix / "gpuslurm-epilog").read_text()
    assert "nothing to change" in ok(run(etc, prefix, "--python", str(other)))


def test_admin_edit_is_refused_until_force(dirs: tuple[Path, Path]) -> None:
    etc, prefix = dirs
    ok(run(etc, prefix))
    prolog = prefix / "gpuslurm-prolog"
    edited = prolog.read_text().replace("exec ", "logger starting; exec ")
    prolog.write_text(edited)
    err = refused(run(etc, prefix))
    assert err.source == str(prolog) and "--force" in err.message
    assert prolog.read_text() == edited
    assert "overwrite" in ok(run(etc, prefix, "--dry-run", "--force"))
    assert prolog.read_text() == edited
    out = ok(run(etc, prefix, "--force"))
    assert f"overwrite (edited by admin) {prolog}" in out
    assert "logger" not in prolog.read_text()
    assert ok(run(etc, prefix)).startswith("nothing to change")


def test_file_not_written_by_gpuslurm_is_refused_but_identical_one_is_adopted(
        dirs: tuple[Path, Path]) -> None:
    etc, prefix = dirs
    snippet = etc / lib.CGROUP_SNIPPET_NAME
    snippet.write_text("ConstrainDevices=no\n")
    err = refused(run(etc, prefix))
    assert err.source == str(snippet) and "not written by gpuslurm" in err.message
    assert not prefix.exists() and snippet.read_text() == "ConstrainDevices=no\n"
    snippet.write_text(lib.CGROUP_SNIPPET)
    snippet.chmod(0o644)
    out = ok(run(etc, prefix))
    assert f"create {snippet}" not in out and f"create {prefix}/gpuslurm-prolog" in out
    assert str(snippet) in json.loads((prefix / lib.MANIFEST_NAME).read_text())["files"]


def test_symlink_at_destination_is_refused_even_with_force(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    etc, prefix = dirs
    target = tmp_path / "shadow"
    target.write_text("precious\n")
    prefix.mkdir(parents=True)
    link = prefix / "gpuslurm-epilog"
    link.symlink_to(target)
    for extra in ((), ("--force",)):
        err = refused(run(etc, prefix, *extra))
        assert err.source == str(link) and "symbolic link" in err.message
    assert target.read_text() == "precious\n" and link.is_symlink()
    assert not (prefix / "gpuslurm-prolog").exists()


def test_wrong_mode_is_restored(dirs: tuple[Path, Path]) -> None:
    etc, prefix = dirs
    ok(run(etc, prefix))
    hook = prefix / "gpuslurm-task-prolog"
    hook.chmod(0o600)
    out = ok(run(etc, prefix))
    assert f"fix owner/mode of {hook}" in out
    assert stat.S_IMODE(hook.stat().st_mode) == 0o755


def test_installed_hook_runs_gpuslurm_with_an_empty_environment(dirs: tuple[Path, Path]) -> None:
    etc, prefix = dirs
    ok(run(etc, prefix))
    for name in HOOK_NAMES:
        command = name.removeprefix("gpuslurm-")
        proc = subprocess.run(["/usr/bin/env", "-i", str(prefix / name), "--help"], capture_output=True,
                              text=True, timeout=60, cwd="/")
        if command in cli.list_commands(click.Context(cli)):
            assert proc.returncode == 0, proc.stderr
            assert f"gpuslurm {command}" in proc.stdout
        else:  # the hook commands are not written yet: gpuslurm's own CLI must still answer
            assert "No module named" not in proc.stderr
            assert proc.returncode == EXIT_BAD_INPUT and f"No such command '{command}'" in proc.stderr


def test_installed_root_hooks_run_the_hook_code_with_an_empty_environment(dirs: tuple[Path, Path]) -> None:
    etc, prefix = dirs
    ok(run(etc, prefix))
    for name in ("gpuslurm-prolog", "gpuslurm-epilog"):
        proc = subprocess.run(["/usr/bin/env", "-i", str(prefix / name)], capture_output=True, text=True,
                              timeout=60, cwd="/")
        hook = name.removeprefix("gpuslurm-")
        # the hook itself ran: no job in the environment is its one-line error, exit code 2
        assert proc.returncode == EXIT_BAD_INPUT, proc.stderr
        assert proc.stderr == f"gpuslurm {hook}: SLURM_JOB_ID: is not set: not running as a Slurm job hook?\n"
    proc = subprocess.run(["/usr/bin/env", "-i", str(prefix / "gpuslurm-prolog"), "extra"],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == EXIT_BAD_INPUT and proc.stderr.startswith("usage: ")


def test_interpreter_that_cannot_import_gpuslurm_is_refused(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    etc, prefix = dirs
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\necho 'No module named gpuslurm' >&2\nexit 1\n")
    fake.chmod(0o755)
    err = refused(run(etc, prefix, "--python", str(fake)))
    assert err.source == str(fake) and "cannot import gpuslurm" in err.message
    assert not prefix.exists()


def test_corrupt_manifest_is_refused(dirs: tuple[Path, Path]) -> None:
    etc, prefix = dirs
    ok(run(etc, prefix))
    (prefix / lib.MANIFEST_NAME).write_text("{not json")
    err = refused(run(etc, prefix))
    assert err.source == str(prefix / lib.MANIFEST_NAME)


def test_prefix_under_a_world_writable_directory_is_refused(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    etc, _ = dirs
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    err = refused(run(etc, open_dir / "gpuslurm"))
    assert str(open_dir) in err.message and "writable by every user" in err.message
    open_dir.chmod(0o1777)  # sticky, like /tmp: others cannot replace what root made there
    ok(run(etc, open_dir / "gpuslurm"))


def test_missing_slurm_etc_is_refused(tmp_path: Path) -> None:
    err = refused(run(tmp_path / "nope", tmp_path / "p"))
    assert err.source == str(tmp_path / "nope")


def test_status_of_an_existing_slurm_conf(dirs: tuple[Path, Path]) -> None:
    etc, prefix = dirs
    (etc / "slurm.conf").write_text("prolog=/old/prolog  # ours\nPrologFlags=alloc,X11\nGresTypes=gpu\n")
    out = ok(run(etc, prefix))
    assert "Prolog=/old/prolog is set, not" in out
    assert "TaskProlog is not set" in out and "PrologFlags lacks Contain" in out
    assert "GresTypes" not in out.splitlines()[-1]
    (etc / "slurm.conf").write_text("\n".join(lib.slurm_conf_lines(prefix)) + "\n")
    assert "already has all of these" in ok(run(etc, prefix))


def test_render_hook_quotes_the_interpreter_and_checks_the_template() -> None:
    text = lib.render_hook("exec @PYTHON@ -I -m gpuslurm prolog\n", "/opt/my env/bin/python3")
    assert text == "exec '/opt/my env/bin/python3' -I -m gpuslurm prolog\n"
    with pytest.raises(InputError, match="exactly once"):
        lib.render_hook("exec python\n", "/usr/bin/python3")


def test_templates_in_the_checkout_are_not_runnable_as_they_are() -> None:
    for name in HOOK_NAMES:
        text, path = lib.template_text(name)
        assert text.count(lib.PLACEHOLDER) == 1, path
        assert not os.access(path, os.X_OK), f"{path} is a template; install renders it"


def test_refusal_is_one_line_and_exit_code_2(dirs: tuple[Path, Path]) -> None:
    etc, prefix = dirs
    ok(run(etc, prefix))
    (prefix / "gpuslurm-prolog").write_text("#!/bin/sh\n")
    proc = subprocess.run([sys.executable, "-m", "gpuslurm", "install", "--slurm-etc", str(etc),
                           "--prefix", str(prefix)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"gpuslurm: {prefix}/gpuslurm-prolog: was changed since gpuslurm installed it; "
        "use --force to overwrite it"]


def test_a_fifo_at_the_throttle_file_or_an_open_throttle_directory_is_refused(
        dirs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # job_submit.lua (Lua 5.1, no stat) would block slurmctld in io.open on a FIFO: issue 9 §2
    etc, prefix = dirs
    os.mkfifo(etc / "gpuslurm-throttle")
    err = refused(run(etc, prefix))
    assert "FIFO" in err.message and err.source == str(etc / "gpuslurm-throttle")
    (etc / "gpuslurm-throttle").unlink()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    cfg = tmp_path / "gpuslurm.toml"
    cfg.write_text(f'[throttle]\nfile = "{shared}/gpuslurm-throttle"\n')
    monkeypatch.setenv("GPUSLURM_CONFIG", str(cfg))
    err = refused(run(etc, prefix))
    assert str(shared) in err.message and "writable by group" in err.message
    shared.chmod(0o755)
    ok(run(etc, prefix))


def test_config_path_is_baked_into_every_hook(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    etc, prefix = dirs
    config = tmp_path / "site.toml"
    config.write_text("[hooks]\ncommand_timeout_s = 5\n")
    ok(run(etc, prefix, "--config", str(config)))
    for name in HOOK_NAMES:
        text = (prefix / name).read_text()
        assert f"\nGPUSLURM_CONFIG={config}\nexport GPUSLURM_CONFIG\nexec {sys.executable} " in text
    # Without --config the hooks name none (they read /etc/gpuslurm/gpuslurm.toml), and changing
    # it is an update of gpuslurm's own files.
    out = ok(run(etc, prefix))
    assert f"update {prefix}/gpuslurm-prolog" in out
    assert "GPUSLURM_CONFIG" not in (prefix / "gpuslurm-prolog").read_text()


@pytest.mark.parametrize("case", ["relative", "missing", "symlink", "group-writable", "dir-writable",
                                  "directory", "unnormalised"])
def test_unsafe_config_path_is_refused(dirs: tuple[Path, Path], tmp_path: Path, case: str) -> None:
    etc, prefix = dirs
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    config = conf_dir / "gpuslurm.toml"
    config.write_text("")
    arg = str(config)
    if case == "relative":
        arg = os.path.relpath(config)
    elif case == "missing":
        arg = str(conf_dir / "absent.toml")
    elif case == "symlink":
        (conf_dir / "link.toml").symlink_to(config)
        arg = str(conf_dir / "link.toml")
    elif case == "group-writable":
        config.chmod(0o664)
    elif case == "dir-writable":
        conf_dir.chmod(0o777)
    elif case == "directory":
        arg = str(conf_dir)
    elif case == "unnormalised":
        arg = f"{conf_dir}/../conf/gpuslurm.toml"
    refused(run(etc, prefix, "--config", arg))
    assert not prefix.exists()


def test_replay_bundle_is_baked_and_checked(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    etc, prefix = dirs
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    ok(CliRunner().invoke(install, ["--slurm-etc", str(etc), "--prefix", str(prefix), "--replay",
                                    str(bundle)], standalone_mode=False))
    text = (prefix / HOOK_NAMES[0]).read_text()
    assert f"\nGPUSLURM_CAPTURE={bundle}\nexport GPUSLURM_CAPTURE\nexec " in text
    bundle.chmod(0o777)
    refused(run(etc, prefix, "--replay", str(bundle)))
    refused(run(etc, prefix, "--replay", "relative/bundle"))


def test_the_walk_of_the_interpreters_code_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    trust.check_interpreter(sys.executable)  # this venv, made by root as CI makes it, is accepted
    monkeypatch.setattr(trust, "MAX_CODE_ENTRIES", 50)
    with pytest.raises(InputError, match="more than 50 files and directories to check"):
        trust.check_interpreter(sys.executable)


def test_the_hooks_sys_path_is_a_python_list_inside_one_sh_word() -> None:
    template = "exec @PYTHON@ -I -S -c 'import sys; sys.path += @SYSPATH@; import x' prolog\n"
    text = lib.render_hook(template, "/usr/bin/python3", sys_path=["/opt/gs/src", '/opt/a"b\\c'])
    assert text == ("exec /usr/bin/python3 -I -S -c 'import sys; sys.path += "
                    '["/opt/gs/src", "/opt/a\\"b\\\\c"]; import x\' prolog\n')
    for bad in (["/opt/it's"], ["relative/dir"], ["/opt/a\nb"], []):
        with pytest.raises(InputError):
            lib.render_hook(template, "/usr/bin/python3", sys_path=bad)


def test_a_directory_written_into_the_hooks_sys_path_that_others_can_change_is_refused(
        dirs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The directories the hooks put on sys.path themselves (an import-line finder's source folder,
    say) are checked like the interpreter's own: a module another user can rewrite would run as
    root in every prolog."""
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    module = code / "pkg" / "m.py"
    module.write_text("")
    trust.check_code_dirs([str(code)])  # root's and closed: accepted
    module.chmod(0o666)
    with pytest.raises(InputError):
        trust.check_code_dirs([str(code)])
    monkeypatch.setattr(lib, "hook_sys_path", lambda python: [*HOOK_DIRS, str(code)])
    etc, prefix = dirs
    assert str(module) in str(refused(run(etc, prefix)))
    assert not prefix.exists()  # nothing written


def test_the_hooks_sys_path_holds_gpuslurm_and_its_dependencies_where_they_are() -> None:
    import click
    import jinja2

    assert str(Path(gpuslurm.__file__).resolve().parents[1]) == HOOK_DIRS[0]
    for module in (click, jinja2):  # dependencies the hooks' imports may reach
        assert os.path.dirname(os.path.dirname(os.path.realpath(module.__file__))) in HOOK_DIRS
    assert all(os.path.isabs(d) for d in HOOK_DIRS) and len(set(HOOK_DIRS)) == len(HOOK_DIRS)


# --- --c-client: the hook server's client in C --------------------------------------------------

needs_cc = pytest.mark.skipif(not os.access(lib.CC, os.X_OK),
                              reason=f"--c-client needs a C compiler at {lib.CC} (not in the release roots)")


@needs_cc
def test_c_client_is_built_and_the_prolog_and_epilog_start_it(dirs: tuple[Path, Path]) -> None:
    etc, prefix = dirs
    out = ok(run(etc, prefix, "--c-client"))
    client = prefix / lib.C_CLIENT
    assert f"create {client}" in out
    assert client.read_bytes()[:4] == b"\x7fELF"
    assert stat.S_IMODE(client.stat().st_mode) == 0o755 and client.stat().st_uid == os.geteuid()
    for hook in ("prolog", "epilog"):
        # the C client, then the hook itself (the entry point, not the Python client) as its fallback
        assert (f'exec {client} {hook} {sys.executable} -I -S -c {HOOK_CODE} {hook} "$@"'
                in (prefix / f"gpuslurm-{hook}").read_text())
    assert lib.C_CLIENT not in (prefix / "gpuslurm-task-prolog").read_text()
    again = ok(run(etc, prefix, "--c-client"))  # the same source and compiler: the same bytes
    assert "nothing to change" in again and "update" not in again
    back = ok(run(etc, prefix))  # without the flag: the hooks start the Python client again
    assert f"update {prefix}/gpuslurm-prolog" in back
    assert f"-c {CLIENT_CODE} prolog" in (prefix / "gpuslurm-prolog").read_text()


@needs_cc
def test_c_client_dry_run_describes_the_binary_in_one_line(dirs: tuple[Path, Path]) -> None:
    etc, prefix = dirs
    out = ok(run(etc, prefix, "--c-client", "--dry-run"))
    lines = [line for line in out.splitlines() if lib.C_CLIENT in line and "built from" in line]
    assert len(lines) == 1 and "hookclient.c" in lines[0] and "bytes, sha256" in lines[0]
    assert "\x7fELF" not in out and not prefix.exists()


def test_c_client_without_a_compiler_is_refused_and_nothing_is_written(
        dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    etc, prefix = dirs
    monkeypatch.setattr(lib, "CC", "/nonexistent/cc")
    err = refused(run(etc, prefix, "--c-client"))
    assert "--c-client needs a C compiler there" in str(err) and "/nonexistent/cc" in str(err)
    assert not prefix.exists()


def test_c_client_is_slurms_not_pbs() -> None:
    # through the CLI group, as a user runs it (a bare `install` would cache a help option without -h)
    result = CliRunner().invoke(cli, ["install", "--pbs", "--c-client"], standalone_mode=False)
    assert isinstance(result.exception, click.UsageError) and "--c-client" in str(result.exception)
