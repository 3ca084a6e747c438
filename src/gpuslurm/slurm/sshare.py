"""Slurm's fair-share tree from ``sshare``, turned into quotas on a share of GPU capacity.

``sshare -P -a -o Account,User,RawShares,NormShares`` prints one row per association in tree
order, depth-first; the depth is the number of spaces before the account name (a user's row
names its account one level deeper than the account's own row). ``RawShares`` is the number an
administrator set with ``sacctmgr … set fairshare=N``, or ``parent`` for an association that
shares its parent's.

An association's *fraction of the cluster* is its raw shares over the raw shares of its siblings,
times its parent's fraction (the root's is 1). ``parent`` associations take no part in their
level; a ``parent`` account's children compete one level up, and a ``parent`` user gets the
fraction of the account whose shares it uses. This is what Slurm computes itself: under Fair Tree
(the default since 19.05) ``NormShares`` is the sibling ratio alone, so the fraction is the product
of ``NormShares`` down the tree; with ``PriorityFlags=NO_FAIR_TREE`` ``NormShares`` already is the
product. Working from ``RawShares`` gives the same answer under both. A user with associations
in several accounts may use all of them: their fractions add up.

Slurm's shares divide the whole cluster; gpuslurm judges one node (the detectors) or the GPUs a
report covers. :func:`quotas` rescales: quota = fraction × cluster GPUs / judged GPUs, capped at 1.

:func:`parse_sshare`, :func:`fractions` and :func:`quotas` are pure; :func:`read_shares` runs
``sshare``; :class:`ShareCache` rereads it at most every ``refresh_s`` seconds and keeps the last
good answer when a read fails.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Generic, NamedTuple, TypeVar

from gpuslurm.errors import CommandError, GpuslurmError, InputError
from gpuslurm.runner import run_command

if TYPE_CHECKING:
    from gpuslurm.config import Config

FIELDS = ("Account", "User", "RawShares", "NormShares")
PARENT = "parent"
RETRY_S = 60.0  # after a failed read, try again this soon (or at refresh_s, if sooner)

T = TypeVar("T")


class ShareRow(NamedTuple):
    """One association as ``sshare`` prints it."""

    depth: int  # spaces before the account name: 0 for root
    account: str
    user: str | None  # None for an account's own row
    raw_shares: int | None  # None: ``parent`` (or blank, as on the root row)
    norm_shares: float | None


class ShareFractions(NamedTuple):
    """Fractions (0–1) of the cluster Slurm's shares give each user and each account."""

    users: Mapping[str, float]
    accounts: Mapping[str, float]


def sshare_argv(sshare: str) -> list[str]:
    """The command line: every association, ``|``-separated, the four columns read here."""
    return [sshare, "-P", "-a", "-o", ",".join(FIELDS)]


def parse_sshare(text: str, source: str = "sshare") -> tuple[ShareRow, ...]:
    """The rows of ``sshare -P -a -o Account,User,RawShares,NormShares`` output (header included)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise InputError("no output (not even the header)", source=source)
    header = tuple(c.strip() for c in lines[0].split("|"))
    if header != FIELDS:
        raise InputError(f"unexpected header {lines[0].strip()!r}: wanted {'|'.join(FIELDS)}",
                         source=source)
    rows: list[ShareRow] = []
    for n, line in enumerate(lines[1:], start=2):
        cells = line.split("|")
        if len(cells) != len(FIELDS):
            raise InputError(f"line {n}: {len(cells)} fields, not {len(FIELDS)}: {line!r}", source=source)
        acct_cell, user, raw, norm = cells
        account = acct_cell.lstrip(" ")
        if not account:
            raise InputError(f"line {n}: no account", source=source)
        rows.append(ShareRow(len(acct_cell) - len(account), account.rstrip(), user.strip() or None,
                             _raw(raw.strip(), n, source), _norm(norm.strip(), n, source)))
    return tuple(rows)


def _raw(cell: str, n: int, source: str) -> int | None:
    if cell in ("", PARENT):
        return None
    if not (cell.isascii() and cell.isdigit() and len(cell) <= 18):
        raise InputError(f"line {n}: RawShares {cell!r} is not a number or 'parent'", source=source)
    return int(cell)


def _norm(cell: str, n: int, source: str) -> float | None:
    if not cell:
        return None
    try:
        return float(cell)
    except ValueError:
        raise InputError(f"line {n}: NormShares {cell!r} is not a number", source=source) from None


class _Node:
    __slots__ = ("children", "parent", "row")

    def __init__(self, row: ShareRow | None, parent: _Node | None) -> None:
        self.row = row
        self.parent = parent
        self.children: list[_Node] = []

    @property
    def uses_parent(self) -> bool:
        return self.row is not None and self.row.raw_shares is None


def _tree(rows: Sequence[ShareRow], source: str) -> _Node:
    """The association tree; the top rows (depth 0, normally just ``root``) hang from a virtual root."""
    top = _Node(None, None)
    path: list[_Node] = [top]  # path[d + 1]: the latest account row at depth d
    for i, row in enumerate(rows):
        if row.depth + 1 > len(path):
            raise InputError(f"row {i + 2} ({row.account}) is indented deeper than its parent",
                             source=source)
        parent = path[row.depth]
        node = _Node(row, parent)
        parent.children.append(node)
        del path[row.depth + 1:]
        if row.user is None:
            path.append(node)
    return top


def _level(node: _Node) -> list[_Node]:
    """The associations competing under ``node``: ``parent`` accounts are flattened into it."""
    out: list[_Node] = []
    for child in node.children:
        if child.uses_parent and child.row is not None and child.row.user is None:
            out.extend(_level(child))
        elif not child.uses_parent:
            out.append(child)
    return out


def fractions(rows: Sequence[ShareRow], source: str = "sshare") -> ShareFractions:
    """Each user's and account's fraction of the cluster (see the module docstring)."""
    top = _tree(rows, source)
    users: dict[str, float] = {}
    accounts: dict[str, float] = {}
    if len(top.children) == 1 and top.children[0].row is not None and top.children[0].row.user is None:
        roots = [top.children[0]]  # the usual single root: it owns the whole cluster
    else:
        roots = [top]
    frac: dict[int, float] = {}

    def walk(node: _Node, f: float) -> None:
        """Rank the level under ``node`` (an account that has shares of its own, fraction ``f``)."""
        level = _level(node)
        total = sum(c.row.raw_shares or 0 for c in level if c.row is not None)
        for c in level:
            assert c.row is not None
            frac[id(c)] = f * (c.row.raw_shares or 0) / total if total else 0.0
        visit(node, f)

    def visit(node: _Node, f: float) -> None:
        """Record ``node``'s children; ``f``: the fraction of the nearest ancestor with shares."""
        for c in node.children:
            row = c.row
            assert row is not None
            cf = f if c.uses_parent else frac[id(c)]
            if row.user is not None:
                users[row.user] = users.get(row.user, 0.0) + cf
                continue
            accounts[row.account] = accounts.get(row.account, 0.0) + cf
            if c.uses_parent:
                visit(c, f)  # its children were ranked in the level above
            else:
                walk(c, cf)

    for r in roots:
        if r.row is not None:
            accounts[r.row.account] = 1.0
        walk(r, 1.0)
    return ShareFractions(users, accounts)


def quotas(shares: ShareFractions, cluster_gpus: int, judged_gpus: int) -> ShareFractions:
    """Fractions of the cluster as quotas on ``judged_gpus`` GPUs, capped at 1.

    ``cluster_gpus`` is how many GPUs Slurm's shares divide; 0 reads the fractions as fractions of
    the judged GPUs themselves (no rescaling).
    """
    scale = cluster_gpus / judged_gpus if cluster_gpus > 0 and judged_gpus > 0 else 1.0
    return ShareFractions({u: min(1.0, f * scale) for u, f in shares.users.items()},
                          {a: min(1.0, f * scale) for a, f in shares.accounts.items()})


def read_shares(sshare: str, *, timeout: float, env: dict[str, str] | None = None) -> ShareFractions:
    """Run ``sshare`` and return the fractions; any failure is one CommandError or InputError line."""
    result = run_command(sshare_argv(sshare), timeout=timeout, env=env, check=False)
    if result.returncode != 0:
        raise CommandError(f"sshare exited {result.returncode}: {_why(result.stderr, result.stdout)}",
                           result.argv, result.returncode, result.stderr)
    return fractions(parse_sshare(result.stdout))


def _why(stderr: str, stdout: str) -> str:
    """The line that says what went wrong: a ``fatal:`` line if any, else the first one."""
    lines = [ln.strip() for ln in (stderr.strip() or stdout.strip()).splitlines() if ln.strip()]
    if not lines:
        return "no output"
    return next((ln for ln in lines if "fatal:" in ln), lines[0])


class ShareCache(Generic[T]):
    """``fetch()`` at most every ``refresh_s`` seconds; a failure keeps the last good value.

    After a failure the next try comes after ``min(refresh_s, RETRY_S)`` (a slurmctld that was
    restarting is read again soon, without hammering one that is down).
    """

    def __init__(self, fetch: Callable[[], T], refresh_s: float, retry_s: float = RETRY_S) -> None:
        self._fetch = fetch
        self.refresh_s = refresh_s
        self.retry_s = min(retry_s, refresh_s)
        self.value: T | None = None
        self._due: float | None = None  # None: read at the first poll

    def poll(self, now: float) -> tuple[T | None, str | None]:
        """``(new value, None)`` after a good read; ``(None, why)`` after a failed one;
        ``(None, None)`` when no read was due."""
        if self._due is not None and now < self._due:
            return None, None
        try:
            value = self._fetch()
        except GpuslurmError as exc:
            self._due = now + self.retry_s
            return None, str(exc)
        self._due = now + self.refresh_s
        self.value = value
        return value, None


def node_quota_cache(cfg: Config, node_gpus: int) -> ShareCache[Mapping[str, float]]:
    """The monitor's feed: users' quotas on a node of ``node_gpus`` GPUs, per ``[detect.share]``."""
    share = cfg.detect.share

    def fetch() -> Mapping[str, float]:
        found = read_shares(cfg.paths.sshare, timeout=cfg.monitor.command_timeout_s)
        return quotas(found, share.slurm_cluster_gpus, node_gpus).users

    return ShareCache(fetch, share.slurm_refresh_s)
