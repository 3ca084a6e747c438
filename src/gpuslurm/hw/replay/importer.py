"""Turn a concatenated multi-command capture into a bundle directory (``capture import``).

The format is the one nvidia_gpu_exporter's ``collect.sh`` writes: each command's output follows
a header of ``#`` rules around ``# <state> :: <name>`` and ``# $ <command>`` lines, where state is
``capabilities``, ``idle`` or ``load``. We keep ``-L``, ``topo -m`` and ``-q``; the idle ``-q``
is preferred because load adds processes and nothing the bundle uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpuslurm.errors import CaptureError
from gpuslurm.hw.formats.smi_text import parse_smi_list, parse_smi_query_text
from gpuslurm.hw.formats.topo_text import parse_topo
from gpuslurm.hw.replay.bundle import SMI_LIST, SMI_TEXT, TOPO, read_text

_RULE_RE = re.compile(r"^#{20,}\s*$")
_TITLE_RE = re.compile(r"^# (?P<state>[\w-]+) :: (?P<name>.+?)\s*$")
_COMMAND_RE = re.compile(r"^# \$ (?P<command>.*?)\s*$")

# Bundle file ← the command whose output it holds, and the section name collect.sh gives it.
_WANTED = {
    SMI_LIST: ("nvidia-smi -L", "list (-L)"),
    TOPO: ("nvidia-smi topo -m", "topo -m"),
    SMI_TEXT: ("nvidia-smi -q", "query (-q)"),
}
_STATE_PREFERENCE = ("capabilities", "idle", "load")


@dataclass(frozen=True)
class Section:
    """One command's output in a multi-command capture."""

    state: str
    name: str
    command: str | None
    line: int  # 1-based line of the title, for messages
    body: str


def split_sections(text: str) -> list[Section]:
    """The command sections of a capture, in file order; text outside sections is dropped."""
    lines = text.splitlines()
    starts: list[int] = [
        i for i in range(len(lines) - 1)
        if _RULE_RE.match(lines[i]) and _TITLE_RE.match(lines[i + 1])
    ]
    sections = []
    for n, start in enumerate(starts):
        title = _TITLE_RE.match(lines[start + 1])
        assert title is not None
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        i, command = start + 2, None
        while i < end and not _RULE_RE.match(lines[i]):
            m = _COMMAND_RE.match(lines[i])
            if m is not None and command is None:
                command = m.group("command")
            i += 1
        body = lines[i + 1:end]
        while body and not body[-1].strip():
            body.pop()
        sections.append(Section(title.group("state"), title.group("name"), command, start + 2,
                                "\n".join(body) + "\n" if body else ""))
    return sections


def _pick(sections: list[Section], command: str, name: str) -> Section | None:
    matching = [s for s in sections if s.command == command or (s.command is None and s.name == name)]
    if not matching:
        return None

    def rank(s: Section) -> int:
        return _STATE_PREFERENCE.index(s.state) if s.state in _STATE_PREFERENCE else len(_STATE_PREFERENCE)

    return min(matching, key=rank)  # min is stable: the first of equals wins


def import_multi_capture(text_path: Path, out_dir: Path) -> list[str]:
    """Write the bundle files found in ``text_path`` into the new or empty ``out_dir``."""
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise CaptureError("exists and is not an empty directory; import into a new one", out_dir)
    sections = split_sections(read_text(text_path))
    picked = {file: _pick(sections, cmd, name) for file, (cmd, name) in _WANTED.items()}
    chosen = {file: s for file, s in picked.items() if s is not None}
    if not chosen:
        raise CaptureError("no nvidia-smi -L, topo -m or -q sections (expected the '# <state> :: <name>' "
                           "headers of nvidia_gpu_exporter's collect.sh)", text_path)
    # Parse before writing, so a bad section fails the import instead of a later replay.
    for name, section in chosen.items():
        where = f"{text_path} (line {section.line}, {section.state} :: {section.name})"
        if name == SMI_LIST:
            parse_smi_list(section.body, where)
        elif name == TOPO:
            parse_topo(section.body, where)
        else:
            parse_smi_query_text(section.body, where)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, section in chosen.items():
        (out_dir / name).write_text(section.body, encoding="utf-8")
    return list(chosen)
