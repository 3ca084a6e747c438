"""tests/helpers/slurm_roots.py's pure parts: the mirror read from apt's configuration, the root's key;
what the cluster fixture says of a root without accounting."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.helpers import cluster_fixture, slurm_roots

HOSTS = st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z]{2,5}){1,2}", fullmatch=True)
SUITES = st.sampled_from(["bookworm", "trixie", "forky", "sid"])


def test_the_deb822_archive_is_taken_and_security_is_not() -> None:
    text = ("Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
            "Components: main\n\n"
            "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\n"
            "Components: main contrib\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    assert slurm_roots.mirror_from([text], []) == "http://mirror.example/debian"


def test_disabled_source_only_and_non_main_stanzas_are_skipped() -> None:
    texts = ["Types: deb\nURIs: http://a.example/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n",
             "Types: deb-src\nURIs: http://b.example/debian\nSuites: bookworm\nComponents: main\n",
             "Types: deb\nURIs: https://c.example/apt\nSuites: nodistro\nComponents: other\n"]
    assert slurm_roots.mirror_from(texts, []) is None


def test_one_line_lists_with_options() -> None:
    lists = ["# a comment\ndeb-src http://x.example/debian bookworm main\n"
             "deb [arch=amd64 signed-by=/k.gpg] http://y.example/debian bookworm main non-free\n"]
    assert slurm_roots.mirror_from([], lists) == "http://y.example/debian"


@given(host=HOSTS, suite=SUITES, deb822=st.booleans(), junk=st.text(max_size=200))
def test_any_archive_line_is_found_whatever_follows(host: str, suite: str, deb822: bool, junk: str) -> None:
    uri = f"http://{host}/debian"
    if deb822:
        stanza = f"Types: deb\nURIs: {uri}\nSuites: {suite}\nComponents: main\n\n{junk}"
        found = slurm_roots.mirror_from([stanza], [])
    else:
        found = slurm_roots.mirror_from([], [f"deb {uri} {suite} main\n{junk}"])
    assert found == uri


@given(sources=st.lists(st.text(max_size=300), max_size=3), lists=st.lists(st.text(max_size=300), max_size=3))
def test_any_text_gives_an_archive_url_or_none(sources: list[str], lists: list[str]) -> None:
    found = slurm_roots.mirror_from(sources, lists)
    assert found is None or (found.split("://", 1)[0] in ("http", "https", "file") and " " not in found)


def test_the_key_changes_with_what_goes_into_the_root() -> None:
    release = slurm_roots.RELEASES["24.11"]
    key = slurm_roots.root_key(release, "http://a.example/debian")
    assert key == slurm_roots.root_key(release, "http://a.example/debian")
    assert key != slurm_roots.root_key(release, "http://b.example/debian")
    assert key != slurm_roots.root_key(slurm_roots.RELEASES["26.05"], "http://a.example/debian")


def test_a_root_without_slurmdbd_fails_the_accounting_tests_under_require(
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CI (GPUSLURM_REQUIRE_SLURM) must not skip the accounting tests on a root that lacks slurmdbd."""
    bare = tmp_path / "root"  # a root of another age: no /usr/sbin/slurmdbd
    (bare / "usr" / "sbin").mkdir(parents=True)
    slurm_roots.activate(slurm_roots.ActiveRoot(slurm_roots.RELEASES["24.11"], bare, tmp_path / "ns.pid"))
    try:
        reason = cluster_fixture.accounting_unavailable()
        assert reason is not None and f"{bare}/usr/sbin/slurmdbd" in reason
        monkeypatch.setenv("GPUSLURM_REQUIRE_SLURM", "1")
        with pytest.raises(pytest.fail.Exception, match="GPUSLURM_REQUIRE_SLURM is set"):
            cluster_fixture.skip_without_accounting()
        monkeypatch.delenv("GPUSLURM_REQUIRE_SLURM")
        with pytest.raises(pytest.skip.Exception):
            cluster_fixture.skip_without_accounting()
    finally:
        slurm_roots.activate(None)
