"""Which cgroup root the task prolog's v1 join tries after the standard one: the site's config
file at the default path (:func:`gpuslurm.isolate.cgroup_v1.configured_cgroup_root`), parsed
only when its text can name ``cgroup_root``, since the join runs before every task."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuslurm import configfile
from gpuslurm.errors import HardwareError, InputError
from gpuslurm.isolate import cgroup_v1
from gpuslurm.isolate.cgroup_v1 import DEFAULT_CGROUP_ROOT, configured_cgroup_root

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture
def site_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The site's config file: the default path, pointed into tmp_path (never the host's)."""
    path = tmp_path / "etc" / "gpuslurm.toml"
    path.parent.mkdir()
    monkeypatch.setattr(configfile, "DEFAULT_PATH", str(path))
    return path


def test_no_site_file_is_the_standard_root(site_file: Path) -> None:
    assert configured_cgroup_root() == DEFAULT_CGROUP_ROOT


@pytest.mark.parametrize("text", [
    '[paths]\ncgroup_root = "/srv/cg"\n',
    '[paths]\n"cgroup_root" = "/srv/cg"\n',
    'paths.cgroup_root = "/srv/cg"\n',
    '[paths]\n"cgroup\\u005Froot" = "/srv/cg"\n',  # the key spelt with a TOML escape
    '[paths]\n"cgroup\\U0000005Froot" = "/srv/cg"\n',
], ids=["line", "quoted-key", "dotted-key", "u-escape", "U-escape"])
def test_a_site_file_that_names_the_root_is_read(site_file: Path, text: str) -> None:
    site_file.write_text(text)
    assert configured_cgroup_root() == "/srv/cg"


def test_a_site_file_without_the_key_is_not_parsed(site_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing in it can set the root, so neither the schema nor tomllib is loaded: this runs
    before every task. (A file that is not TOML at all shows it was not parsed.)"""
    site_file.write_text('[paths]\nrun_dir = "/run/x"\n[[[ not toml\n')
    assert configured_cgroup_root() == DEFAULT_CGROUP_ROOT
    code = ("import sys; from gpuslurm.isolate.cgroup_v1 import configured_cgroup_root as f; "
            "import gpuslurm.configfile as c; c.DEFAULT_PATH = sys.argv[1]; print(f()); "
            "print(sorted(m for m in ('gpuslurm.config', 'tomllib') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {SRC!r}); " + code,
                           str(site_file)], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split("\n")[:2] == [DEFAULT_CGROUP_ROOT, "[]"], done.stdout


def test_a_damaged_site_file_that_names_the_key_is_an_input_error(site_file: Path) -> None:
    """join_job_cgroup then joins at the standard root alone (it catches this)."""
    site_file.write_text('[paths]\ncgroup_root = \n')
    with pytest.raises(InputError):
        configured_cgroup_root()


def test_the_jobs_own_config_file_is_not_read(site_file: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """As the job's user: $GPUSLURM_CONFIG in the task's environment names a file of mine that
    moves the root somewhere I made. The join still reads only the site's file."""
    mine = tmp_path / "mine.toml"
    mine.write_text('[paths]\ncgroup_root = "/home/me/fake-cgroup"\n')
    monkeypatch.setenv("GPUSLURM_CONFIG", str(mine))
    assert configured_cgroup_root() == DEFAULT_CGROUP_ROOT
    site_file.write_text('[paths]\ncgroup_root = "/srv/cg"\n')
    assert configured_cgroup_root() == "/srv/cg"


def test_a_key_spelt_with_a_toml_1_1_escape_is_parsed_not_skipped(site_file: Path) -> None:
    """TOML 1.1 (Python 3.15's tomllib) adds ``\\xHH``: any backslash means the file is parsed."""
    site_file.write_text('[paths]\n"cgroup\\x5Froot" = "/srv/cg"\n')
    try:
        got = configured_cgroup_root()
    except InputError:  # TOML 1.0's parsers (tomllib before 3.15) refuse the escape: damaged
        return
    assert got == "/srv/cg"


class _Joins:
    """join_v1 as the join sees it: the roots it was asked for, in order; ``at``: the root where
    the job has its devices cgroup; ``fail``: a root where the join raises (cannot join)."""

    def __init__(self, at: str | None = None, fail: str | None = None) -> None:
        self.at, self.fail = at, fail
        self.asked: list[str] = []

    def __call__(self, root: str, job_id: str, pid: int) -> str | None:
        self.asked.append(root)
        if root == self.fail:
            raise HardwareError(f"cannot join at {root}")
        return f"{root}/devices/gpuslurm/job_{job_id}" if root == self.at else None


class _Configured:
    """configured_cgroup_root as the join sees it: ``value`` (or raising it), counting reads."""

    def __init__(self, value: str | Exception) -> None:
        self.value, self.reads = value, 0

    def __call__(self) -> str:
        self.reads += 1
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


@pytest.mark.parametrize(("joins", "configured", "joined", "asked", "reads"), [
    # the job's cgroup at the standard root: the site's file is not even read
    (_Joins(at=DEFAULT_CGROUP_ROOT), _Configured("/srv/cg"), True, [DEFAULT_CGROUP_ROOT], 0),
    (_Joins(at="/srv/cg"), _Configured("/srv/cg"), True, [DEFAULT_CGROUP_ROOT, "/srv/cg"], 1),
    (_Joins(), _Configured(DEFAULT_CGROUP_ROOT), False, [DEFAULT_CGROUP_ROOT], 1),
    # a damaged site file: the standard root alone (tried already), never an error for the task
    (_Joins(at="/srv/cg"), _Configured(InputError("not valid TOML")), False, [DEFAULT_CGROUP_ROOT], 1),
], ids=["standard-root", "configured-root", "no-cgroup", "damaged-site-file"])
def test_the_join_tries_the_standard_root_then_the_sites(monkeypatch: pytest.MonkeyPatch, joins: _Joins,
                                                          configured: _Configured, joined: bool,
                                                          asked: list[str], reads: int) -> None:
    monkeypatch.setattr(cgroup_v1, "join_v1", joins)
    monkeypatch.setattr(cgroup_v1, "configured_cgroup_root", configured)
    assert (cgroup_v1.join_job_cgroup("77", 4242) is not None) is joined
    assert joins.asked == asked
    assert configured.reads == reads


@pytest.mark.parametrize("fail", [DEFAULT_CGROUP_ROOT, "/srv/cg"])
def test_a_job_cgroup_the_task_cannot_join_refuses_it_at_either_root(monkeypatch: pytest.MonkeyPatch,
                                                                     fail: str) -> None:
    """Fail closed: the join's error reaches the task prolog, which refuses the task."""
    monkeypatch.setattr(cgroup_v1, "join_v1", _Joins(fail=fail))
    monkeypatch.setattr(cgroup_v1, "configured_cgroup_root", _Configured("/srv/cg"))
    with pytest.raises(HardwareError):
        cgroup_v1.join_job_cgroup("77", 4242)
