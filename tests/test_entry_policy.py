"""One entry-point error policy (gpuslurm.errors.run_entry) and exit codes defined once.

Every entry point (the CLI, pick, Slurm's prolog, epilog and task prolog, the PBS hook's events, the classic
PBS prologue and epilogue) turns the same exception into the same exit code and the same one-line
message, because each goes through run_entry; the codes themselves are gpuslurm.errors' alone.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm import errors
from gpuslurm.errors import (
    EXIT_BAD_INPUT,
    EXIT_CHECK_FAILED,
    EXIT_EXTERNAL,
    EXIT_HARDWARE,
    EXIT_INTERNAL,
    CheckMismatchError,
    CommandError,
    HardwareError,
    InputError,
    run_entry,
)
from gpuslurm.hooks.log import HookLog

SRC = Path(__file__).resolve().parents[1] / "src" / "gpuslurm"

# exception -> (exit code, what the one line says after the entry point's own prefix)
CASES: list[tuple[Exception, int, str]] = [
    (InputError("no such file", source="/etc/gpuslurm.toml"), EXIT_BAD_INPUT,
     "/etc/gpuslurm.toml: no such file"),
    (HardwareError("NVML: driver not loaded"), EXIT_HARDWARE, "NVML: driver not loaded"),
    (CommandError("scontrol timed out"), EXIT_EXTERNAL, "scontrol timed out"),
    (CheckMismatchError("2 mismatch(es)"), EXIT_CHECK_FAILED, "2 mismatch(es)"),
    (RuntimeError("a bug\nwith a second line"), EXIT_INTERNAL,
     "internal error: RuntimeError: a bug with a second line"),
]


def _raiser(exc: Exception) -> Callable[..., int]:
    def raise_it(*args: object, **kwargs: object) -> int:
        raise exc
    return raise_it


def cli(exc: Exception, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> tuple[int, str]:
    from gpuslurm.cli import main as cli_main

    monkeypatch.setattr(cli_main, "run_cli", _raiser(exc))
    rc = cli_main.main(["discover"])
    return rc, capsys.readouterr().err


def pick(exc: Exception, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
         tmp_path: Path) -> tuple[int, str]:
    from gpuslurm.cli import pick_cmd

    monkeypatch.setattr(pick_cmd, "run_pick", _raiser(exc))
    rc = pick_cmd.main(["1"])
    return rc, capsys.readouterr().err


def _slurm(hook: str) -> Callable[..., tuple[int, str]]:
    def run(exc: Exception, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            tmp_path: Path) -> tuple[int, str]:
        from gpuslurm.slurm import hooks

        monkeypatch.setattr(hooks, "_setup", _raiser(exc))
        stream = io.StringIO()
        log = HookLog(hook, stream=stream, use_syslog=False)
        rc = hooks.run_prolog({}, log) if hook == "prolog" else hooks.run_epilog({}, log)
        return rc, stream.getvalue()
    return run


def task_prolog(exc: Exception, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                tmp_path: Path) -> tuple[int, str]:
    from gpuslurm.hooks import taskprolog
    from gpuslurm.slurm import hooks

    monkeypatch.setattr(taskprolog, "task_start", _raiser(exc))
    stream, out = io.StringIO(), io.StringIO()
    rc = hooks.run_task_prolog({}, out, HookLog("task-prolog", stream=stream, use_syslog=False))
    assert out.getvalue() == ""
    return rc, stream.getvalue()


def _pbs_hook(event: str) -> Callable[..., tuple[int, str]]:
    def run(exc: Exception, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            tmp_path: Path) -> tuple[int, str]:
        from gpuslurm.pbs import entry

        monkeypatch.setattr(entry, "answer_event", _raiser(exc))
        out, err = io.StringIO(), io.StringIO()
        rc = entry.main([event], stdin=io.BytesIO(b"{}"), stdout=out, stderr=err)
        assert out.getvalue() == ""  # no answer: the hook fails the event as its policy says
        return rc, err.getvalue()
    return run


def _pbs_classic(kind: str) -> Callable[..., tuple[int, str]]:
    def run(exc: Exception, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            tmp_path: Path) -> tuple[int, str]:
        from gpuslurm.pbs import classic

        monkeypatch.setattr(classic, "_run", _raiser(exc))
        args = ["7.pbshost", "nobody", "nogroup"] + (["job", "1", "r", "u", "q", "a", "0"]
                                                     if kind == "epilogue" else [])
        err = io.StringIO()
        rc = classic.main(kind, args, environ={}, stderr=err, mom_priv=str(tmp_path))
        return rc, err.getvalue()
    return run


ENTRIES: dict[str, Callable[..., tuple[int, str]]] = {
    "cli": cli, "pick": pick, "slurm prolog": _slurm("prolog"), "slurm epilog": _slurm("epilog"),
    "slurm task-prolog": task_prolog,
    **{f"pbs {e}": _pbs_hook(e) for e in ("exechost_startup", "execjob_begin", "execjob_launch",
                                          "execjob_attach", "execjob_end")},
    "pbs prologue": _pbs_classic("prologue"), "pbs epilogue": _pbs_classic("epilogue"),
}


@pytest.mark.parametrize("name", sorted(ENTRIES))
@pytest.mark.parametrize(("exc", "code", "message"), CASES, ids=[type(c[0]).__name__ for c in CASES])
def test_every_entry_maps_an_exception_alike(name: str, exc: Exception, code: int, message: str,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.delenv("GPUSLURM_DEBUG", raising=False)
    rc, err = ENTRIES[name](exc, monkeypatch, capsys, tmp_path)
    lines = err.splitlines()
    assert rc == code
    assert len(lines) == 1 and message in lines[0], lines
    if code == EXIT_INTERNAL and name in ("cli", "pick"):  # the commands say how to see more
        assert lines[0].endswith("(set GPUSLURM_DEBUG=1 for a traceback)")


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_every_entry_uses_the_one_policy(name: str, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Change the policy's mapping and every entry point follows: none keeps a handler of its own."""
    monkeypatch.setattr(errors, "describe", lambda exc: (99, f"the one policy saw {type(exc).__name__}"))
    rc, err = ENTRIES[name](CommandError("squeue failed"), monkeypatch, capsys, tmp_path)
    assert rc == 99
    assert "the one policy saw CommandError" in err


def test_exit_codes_are_defined_once() -> None:
    """No module but gpuslurm.errors assigns an exit code (``EXIT_X = n``) or returns a bare 70."""
    found = []
    for path in SRC.rglob("*.py"):
        if path.name == "errors.py" and path.parent == SRC:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"\s*EXIT_[A-Z_]+\s*=", line) or re.search(r"\breturn 70\b|exit\(70\)", line):
                found.append(f"{path.relative_to(SRC)}:{n}: {line.strip()}")
    assert not found, found


def test_a_bug_is_raised_when_debugging_and_let_through_is_raised_as_is() -> None:
    said: list[str] = []
    with pytest.raises(KeyError):
        run_entry(_raiser(KeyError("x")), said.append, reraise_bugs=True)
    assert run_entry(_raiser(InputError("bad")), said.append, reraise_bugs=True) == EXIT_BAD_INPUT
    with pytest.raises(BrokenPipeError):
        run_entry(_raiser(BrokenPipeError()), said.append, let_through=(BrokenPipeError,))
    with pytest.raises(KeyboardInterrupt):  # BaseException is the caller's (pick, the CLI: 130)
        run_entry(lambda: (_ for _ in ()).throw(KeyboardInterrupt()), said.append)
    assert said == ["bad"]


@given(st.text(max_size=200))
def test_the_message_is_one_line_whatever_the_exception_says(text: str) -> None:
    for exc in (RuntimeError(text), InputError(text, source=text), CommandError(text)):
        code, message = errors.describe(exc)
        assert len(message.splitlines()) <= 1
        assert code == (EXIT_INTERNAL if isinstance(exc, RuntimeError) else exc.exit_code)


def test_the_docs_list_every_code_once_as_errors_py_defines_it() -> None:
    doc = SRC.parents[1] / "docs" / "exit-codes.md"
    if not doc.exists():
        pytest.skip("docs/ is not in this checkout (sdist)")
    rows = re.findall(r"^\| (\d+) \| `(EXIT_[A-Z_]+)` \|", doc.read_text(), re.MULTILINE)
    defined = {name: getattr(errors, name) for name in dir(errors) if name.startswith("EXIT_")}
    assert sorted(name for _, name in rows) == sorted(defined)
    assert all(defined[name] == int(code) for code, name in rows), rows
