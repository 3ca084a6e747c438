"""sshare: parsing, Slurm's shares as fractions of the cluster and as quotas, errors, the cache.

``sshare/handmade-tree.txt`` is written by hand in 22.05's ``-P`` format (a tree with ``parent``
shares at both account and user level, and a user in two accounts); ``sshare/recorded-*.txt``
are real outputs of Slurm 22.05.8 with slurmdbd (see test_cluster_sshare in tests/cluster).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from gpuslurm.errors import CommandError, GpuslurmError, InputError
from gpuslurm.slurm.sshare import (
    ShareCache,
    ShareFractions,
    ShareRow,
    fractions,
    parse_sshare,
    quotas,
    read_shares,
    sshare_argv,
)

HERE = Path(__file__).parent / "sshare"
HANDMADE = (HERE / "handmade-tree.txt").read_text()
SSHARE = "/usr/bin/sshare"


def test_rows_keep_depth_user_and_parent_shares() -> None:
    rows = parse_sshare(HANDMADE)
    assert rows[0] == ShareRow(0, "root", None, None, 0.0)
    assert rows[1] == ShareRow(1, "root", "root", 1, 0.125)
    assert rows[8] == ShareRow(2, "theory", None, None, 0.375)  # parent
    assert rows[10] == ShareRow(3, "theory", "dave", None, 0.375)
    assert [r.depth for r in rows] == [0, 1, 1, 2, 2, 1, 2, 2, 2, 3, 3]


def test_fractions_of_the_cluster() -> None:
    f = fractions(parse_sshare(HANDMADE))
    # root level: root 1, chem 4, physics 3 → /8; physics level: alice 1, bob 3 and theory's
    # carol 4 (theory's shares are its parent's, so its children compete in physics) → /8
    assert f.users == pytest.approx({
        "root": 1 / 8,
        "alice": 4 / 8 * 1 / 2 + 3 / 8 * 1 / 8,  # in chem and in physics: both count
        "erin": 4 / 8 * 1 / 2,
        "bob": 3 / 8 * 3 / 8,
        "carol": 3 / 8 * 4 / 8,
        "dave": 3 / 8,  # shares=parent: physics's fraction, the nearest account with shares
    })
    assert f.accounts == pytest.approx({"root": 1.0, "chem": 0.5, "physics": 3 / 8, "theory": 3 / 8})
    with_shares = ("root", "alice", "erin", "bob", "carol")
    assert sum(f.users[u] for u in with_shares) == pytest.approx(1.0)  # the cluster, divided


def _fair_tree_products(rows: tuple[ShareRow, ...]) -> dict[str, float]:
    """Under Fair Tree NormShares is the sibling ratio: the product down the tree, skipping
    ``parent`` associations (their NormShares is the parent's own)."""
    out: dict[str, float] = {}
    path: list[float] = []
    for r in rows:
        del path[r.depth:]
        own = 1.0 if r.depth == 0 or r.raw_shares is None else (r.norm_shares or 0.0)
        if r.user is None:
            path.append(own)
        elif r.raw_shares is not None:
            out[r.user] = out.get(r.user, 0.0) + math.prod(path) * own
    return out


@pytest.mark.parametrize("name", sorted(p.name for p in HERE.glob("*.txt")))
def test_fractions_equal_the_product_of_normshares(name: str) -> None:
    rows = parse_sshare((HERE / name).read_text(), name)
    f = fractions(rows)
    products = _fair_tree_products(rows)
    assert products
    for user, p in products.items():
        assert f.users[user] == pytest.approx(p, abs=2e-6), user  # NormShares has 6 decimals


def test_quotas_rescale_to_the_judged_gpus_and_cap_at_one() -> None:
    f = ShareFractions({"alice": 0.1, "bob": 0.2, "root": 0.0}, {"physics": 0.05})
    q = quotas(f, cluster_gpus=64, judged_gpus=8)  # 10 % of 64 GPUs = 6.4 GPUs = 0.8 of a node
    assert q.users == pytest.approx({"alice": 0.8, "bob": 1.0, "root": 0.0})
    assert q.accounts == pytest.approx({"physics": 0.4})
    assert quotas(f, cluster_gpus=0, judged_gpus=8) == f  # 0: the fractions as they are
    assert quotas(f, cluster_gpus=64, judged_gpus=0) == f  # no GPUs judged: nothing to rescale


def test_a_header_only_answer_is_an_empty_tree() -> None:
    assert fractions(parse_sshare("Account|User|RawShares|NormShares\n")) == ShareFractions({}, {})


def test_zero_shares_everywhere_gives_zero_not_a_division_error() -> None:
    text = "Account|User|RawShares|NormShares\nroot|||0\n a||0|0\n  a|u|0|0\n"
    assert fractions(parse_sshare(text)) == ShareFractions({"u": 0.0}, {"root": 1.0, "a": 0.0})


@pytest.mark.parametrize("text,message", [
    ("", "sshare: no output (not even the header)"),
    ("Account|User|RawShares\n", "sshare: unexpected header 'Account|User|RawShares': wanted "
                                 "Account|User|RawShares|NormShares"),
    ("Account|User|RawShares|NormShares\nroot||1\n", "sshare: line 2: 3 fields, not 4: 'root||1'"),
    ("Account|User|RawShares|NormShares\nroot||lots|1\n",
     "sshare: line 2: RawShares 'lots' is not a number or 'parent'"),
    ("Account|User|RawShares|NormShares\nroot||1|x\n", "sshare: line 2: NormShares 'x' is not a number"),
    ("Account|User|RawShares|NormShares\n |u|1|1\n", "sshare: line 2: no account"),
])
def test_bad_output_is_one_line(text: str, message: str) -> None:
    with pytest.raises(InputError) as err:
        parse_sshare(text)
    assert str(err.value) == message


def test_a_row_deeper_than_its_parent_is_refused() -> None:
    with pytest.raises(InputError, match=r"row 3 \(a\) is indented deeper than its parent"):
        fractions(parse_sshare("Account|User|RawShares|NormShares\nroot|||0\n   a||1|1\n"))


# --- running sshare --------------------------------------------------------------------------


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "sshare"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_read_shares_runs_the_documented_command(tmp_path: Path) -> None:
    args = tmp_path / "args"
    fake = _script(tmp_path, f'echo "$@" > {args}\ncat {HERE / "handmade-tree.txt"}')
    f = read_shares(fake, timeout=10)
    assert f.users["dave"] == pytest.approx(3 / 8)
    assert args.read_text().split() == sshare_argv(fake)[1:] == [
        "-P", "-a", "-o", "Account,User,RawShares,NormShares"]


@pytest.mark.skipif(not os.access(SSHARE, os.X_OK), reason="Slurm's sshare is not installed")
def test_real_sshare_without_a_controller_is_one_line(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"  # a controller on a port nobody listens on
    conf.write_text("ClusterName=nowhere\nSlurmctldHost=localhost\nSlurmctldPort=1\n"
                    "NodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    with pytest.raises(CommandError) as err:
        read_shares(SSHARE, timeout=30, env={"SLURM_CONF": str(conf)})
    assert str(err.value) == ("sshare exited 255: Couldn't get shares from controller: "
                              "Unable to contact slurm controller (connect failure)")


@pytest.mark.skipif(not os.access(SSHARE, os.X_OK), reason="Slurm's sshare is not installed")
def test_real_sshare_without_a_config_names_the_fatal_line() -> None:
    if os.path.exists("/etc/slurm/slurm.conf"):
        pytest.skip("this host has a default slurm.conf")
    with pytest.raises(CommandError) as err:  # no config, no DNS SRV record: several stderr lines
        read_shares(SSHARE, timeout=30, env={})
    assert "\n" not in str(err.value) and str(err.value).startswith("sshare exited 1: sshare: fatal:")


def test_timeout_and_missing_binary_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match=r"^sshare: timed out after 0.3 s$"):
        read_shares(_script(tmp_path, "exec /bin/sleep 30"), timeout=0.3)
    with pytest.raises(CommandError, match=r"^/nonexistent/sshare: not found$"):
        read_shares("/nonexistent/sshare", timeout=1)


def test_output_that_is_not_sshare_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unexpected header"):
        read_shares(_script(tmp_path, "echo 'You are not running a supported priority plugin'"),
                    timeout=5)


# --- the cache -------------------------------------------------------------------------------


class Answers:
    """fetch() answers in turn: a value, or an exception to raise."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self) -> object:
        self.calls += 1
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a


def test_cache_reads_at_most_every_refresh_and_keeps_the_last_good_value() -> None:
    fetch = Answers({"a": 0.1}, CommandError("sshare: timed out after 10 s"), {"a": 0.2})
    cache: ShareCache[object] = ShareCache(fetch, refresh_s=300.0, retry_s=60.0)
    assert cache.poll(1000.0) == ({"a": 0.1}, None)
    assert cache.poll(1299.0) == (None, None) and fetch.calls == 1  # not due yet
    assert cache.poll(1300.0) == (None, "sshare: timed out after 10 s")
    assert cache.value == {"a": 0.1}  # the last good answer stays
    assert cache.poll(1359.0) == (None, None)  # a failure is retried after retry_s, not refresh_s
    assert cache.poll(1360.0) == ({"a": 0.2}, None) and fetch.calls == 3
    assert cache.poll(1659.0) == (None, None)


def test_cache_retry_is_never_later_than_the_refresh() -> None:
    fetch = Answers(InputError("bad"), {"a": 1.0})
    cache: ShareCache[object] = ShareCache(fetch, refresh_s=20.0)
    assert cache.poll(0.0) == (None, "bad") and cache.value is None
    assert cache.poll(20.0) == ({"a": 1.0}, None)


def test_only_gpuslurm_errors_are_kept_as_problems() -> None:
    cache: ShareCache[object] = ShareCache(Answers(ValueError("a bug")), refresh_s=60.0)
    with pytest.raises(ValueError):
        cache.poll(0.0)
    assert issubclass(CommandError, GpuslurmError)
