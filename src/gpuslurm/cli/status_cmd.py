"""``gpuslurm status`` and ``gpuslurm watch``: the node's GPUs, jobs, processes and violations now.

The snapshot and its layout are pure (:mod:`gpuslurm.watch.view`); this module only talks to the
terminal. ``watch`` redraws in place with plain ANSI sequences on the alternate screen (no curses:
one frame of text is all it draws), follows the terminal's size (SIGWINCH redraws at once), and
exits 0 on Ctrl-C or SIGTERM. When its output is not a terminal it prints one frame per interval.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import IO

import click

from gpuslurm.cli.main import from_option, json_option
from gpuslurm.cli.schedulers import scheduler_for
from gpuslurm.config import load_config
from gpuslurm.hw.source import hardware_source
from gpuslurm.jsondoc import document
from gpuslurm.watch.live import LiveView
from gpuslurm.watch.view import Line, plain, render, snapshot_dict, styled

ENTER = "\x1b[?1049h\x1b[?25l"  # alternate screen, cursor hidden
LEAVE = "\x1b[?25h\x1b[?1049l"
HOME = "\x1b[H"
CLEAR_LINE = "\x1b[K"
CLEAR_BELOW = "\x1b[J"

_db_option = click.option("--db", metavar="PATH",
                          help="The monitor's SQLite store to read violations from "
                               "(default: [monitor] db, else <state_dir>/monitor.db).")


def _open(source: str | None, db: str | None) -> LiveView:
    cfg = load_config()
    hardware = hardware_source(source, nvml_library=cfg.paths.nvml_library)
    return LiveView(cfg, hardware, db, scheduler=scheduler_for(cfg, cfg.monitor.command_timeout_s))


@click.command("status")
@from_option
@json_option
@_db_option
def status(source: str | None, as_json: bool, db: str | None) -> None:
    """Show each GPU with its jobs, users, processes, health and current violations (once)."""
    live = _open(source, db)
    try:
        snap = live.snapshot()
    finally:
        live.close()
    if as_json:
        sys.stdout.write(json.dumps(document("status", snapshot_dict(snap), snap.node), indent=2) + "\n")
        return
    lines = render(snap, _width(sys.stdout))
    if _colour(sys.stdout):
        sys.stdout.write("".join(styled(line) + "\n" for line in lines))
    else:
        sys.stdout.write(plain(lines))


def _interval(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not 0.1 <= value <= 3600:
        raise click.BadParameter("must be between 0.1 and 3600 seconds")
    return value


@click.command("watch")
@click.option("--interval", "-n", type=float, default=2.0, show_default=True, metavar="SECONDS",
              callback=_interval, help="Seconds between frames.")
@click.option("--count", type=click.IntRange(min=1), metavar="N", help="Stop after N frames.")
@from_option
@_db_option
def watch(interval: float, count: int | None, source: str | None, db: str | None) -> None:
    """Redraw the status view every interval until Ctrl-C (like top, but job-aware)."""
    live = _open(source, db)
    try:
        run_watch(live, sys.stdout, interval, count)
    finally:
        live.close()


def run_watch(live: LiveView, out: IO[str], interval: float, count: int | None = None) -> int:
    """Draw frames of ``live.snapshot()`` on ``out`` until stopped; the number of frames drawn."""
    tty = out.isatty()
    wake = _Wakeup()
    stopped: list[int] = []

    def on_stop(signum: int, frame: FrameType | None) -> None:
        stopped.append(signum)

    def on_resize(signum: int, frame: FrameType | None) -> None:
        pass  # the wakeup byte the interpreter wrote is all a resize needs

    old = {sig: signal.signal(sig, handler) for sig, handler in
           ((signal.SIGINT, on_stop), (signal.SIGTERM, on_stop), (signal.SIGWINCH, on_resize))}
    old_wakeup = signal.set_wakeup_fd(wake.write_fd, warn_on_full_buffer=False)
    frames = 0
    if tty:
        out.write(ENTER)
    try:
        snap = None
        due = True
        while not stopped:
            wake.clear()  # before drawing: a signal that comes while drawing must cut the wait short
            if due:
                snap = live.snapshot()
                frames += 1
            assert snap is not None
            if tty:
                size = shutil.get_terminal_size()
                _draw(out, render(snap, size.columns), size.lines)
            else:
                if frames > 1:
                    out.write("\n")
                out.write(plain(render(snap, _width(out))))
                out.flush()
            if count is not None and frames >= count:
                break
            if stopped:  # a signal between the loop's test and clear() left no byte in the pipe
                break
            woke = wake.wait(interval)
            # a resize redraws the frame it has; only the interval takes a new sample
            due = not woke or bool(stopped)
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)
        signal.set_wakeup_fd(old_wakeup)
        wake.close()
        if tty:
            out.write(LEAVE)
            out.flush()
    return frames


class _Wakeup:
    """The pipe that cuts the loop's wait short: the interpreter's signal wakeup fd, not a lock.

    A Python handler runs in the main thread between two bytecodes; one that took a lock the loop
    held at that moment (an Event's, in clear() or at the start of wait()) waited for itself, and
    watch hung for good, Ctrl-C included. A handler that wrote the byte itself came too late when
    the signal arrived after the interpreter's last check and before ``select`` slept: the handler
    then waits for the select to end (a whole interval; seen on Python 3.14). As the wakeup fd
    (``signal.set_wakeup_fd``), the pipe gets its byte from the C-level handler the moment the
    signal arrives, whatever the main thread is doing, so a wait that begins after it ends at once.
    """

    def __init__(self) -> None:
        self._read, self.write_fd = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self.write_fd, False)

    def clear(self) -> None:
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass

    def wait(self, timeout: float) -> bool:
        """Whether a signal came (now or since the last clear) within ``timeout`` seconds."""
        return bool(select.select([self._read], [], [], timeout)[0])

    def close(self) -> None:
        os.close(self._read)
        os.close(self.write_fd)


def _draw(out: IO[str], lines: Sequence[Line], rows: int) -> None:
    shown = list(lines)
    if len(shown) > rows:  # keep the last row to say what did not fit
        hidden = len(shown) - rows + 1
        shown = [*shown[:rows - 1], Line(f"… {hidden} more lines (enlarge the terminal)", "dim")]
    body = (CLEAR_LINE + "\n").join(styled(line) for line in shown)
    out.write(HOME + body + CLEAR_LINE + CLEAR_BELOW)
    out.flush()


def _width(out: IO[str]) -> int:
    """The terminal's width; 80 when the output is not a terminal (or COLUMNS says otherwise)."""
    if out.isatty():
        return shutil.get_terminal_size().columns
    try:
        return int(os.environ.get("COLUMNS", "80"))
    except ValueError:
        return 80


def _colour(out: IO[str]) -> bool:
    return out.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
