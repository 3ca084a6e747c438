"""``gpuslurm install`` against a member of a group that can write somewhere on the path.

A real group and a real member (made here with groupadd/useradd, removed after): the member does
the attack as their own account, then install must refuse with one line and exit 2. Root only.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes a real group and user: needs root")


@dataclass
class Staff:
    uid: int
    gid: int
    root: Path  # a 0755 root-owned scratch directory everyone can reach

    def as_member(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), user=self.uid, group=self.gid, extra_groups=[self.gid],
                              capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})

    def staff_dir(self, path: Path) -> Path:
        """``path`` as root:staff 2775, the usual shared-software directory."""
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, 0, self.gid)
        path.chmod(0o2775)
        return path


@pytest.fixture
def staff() -> Iterator[Staff]:
    tag = os.getpid() % 100000
    group, user = f"gsstaff{tag}", f"gsmember{tag}"
    subprocess.run(["/usr/sbin/groupadd", group], check=True, timeout=30)
    root = Path(tempfile.mkdtemp(prefix="gpuslurm-install-"))
    try:
        subprocess.run(["/usr/sbin/useradd", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        "--user-group", "--groups", group, user], check=True, timeout=30)
        root.chmod(0o755)
        yield Staff(pwd.getpwnam(user).pw_uid, grp.getgrnam(group).gr_gid, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["/usr/sbin/userdel", user], check=False, timeout=30)
        subprocess.run(["/usr/sbin/groupdel", group], check=False, timeout=30)


# The interpreters venvs are made from: this one, and Debian's python3 when the host has it
# (Debian's site.py names a venv's site-packages only when it runs in the venv: install's check,
# which runs the interpreter without site, once missed every .pth file there).
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture(params=["this-python", "system-python"])
def base_python(request: pytest.FixtureRequest) -> str:
    if request.param == "this-python":
        return sys.executable
    if not os.access(SYSTEM_PYTHON, os.X_OK) or subprocess.run(
            [SYSTEM_PYTHON, "-c", "import venv"], capture_output=True, timeout=60).returncode != 0:
        pytest.skip(f"{SYSTEM_PYTHON} is absent or has no venv module")
    return SYSTEM_PYTHON


def install(etc: Path, prefix: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuslurm", "install", "--slurm-etc", str(etc),
                           "--prefix", str(prefix), *extra], capture_output=True, text=True, timeout=120)


def refused_one_line(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), lines
    return lines[0]


def etc_dir(staff: Staff) -> Path:
    etc = staff.root / "etc"
    etc.mkdir()
    return etc


def test_a_prefix_under_a_group_writable_directory_is_refused(staff: Staff) -> None:
    shared = staff.staff_dir(staff.root / "opt")
    prefix = shared / "gpuslurm"
    prefix.mkdir(mode=0o755)
    # The attack: the member renames root's directory away and puts their own in its place.
    assert staff.as_member("/bin/mv", str(prefix), str(shared / "moved")).returncode == 0
    assert staff.as_member("/bin/mkdir", str(prefix)).returncode == 0
    assert prefix.stat().st_uid == staff.uid
    shutil.rmtree(prefix)
    (shared / "moved").rename(prefix)
    line = refused_one_line(install(etc_dir(staff), prefix), str(shared), "writable by group")
    assert line.startswith("gpuslurm: ")
    assert os.listdir(prefix) == []  # nothing written


def test_a_group_writable_slurm_etc_is_refused(staff: Staff) -> None:
    etc = staff.staff_dir(staff.root / "etc")
    refused_one_line(install(etc, staff.root / "libexec"), str(etc), "writable by group")
    assert not (staff.root / "libexec").exists()


def test_an_interpreter_in_a_group_writable_directory_is_refused(staff: Staff) -> None:
    bindir = staff.staff_dir(staff.root / "bin")
    python = bindir / "python3"
    python.symlink_to(os.path.realpath(sys.executable))
    # The member could replace the interpreter the hooks run as root.
    assert staff.as_member("/bin/mv", str(python), str(bindir / "old")).returncode == 0
    (bindir / "old").rename(python)
    refused_one_line(install(etc_dir(staff), staff.root / "libexec", "--python", str(python)),
                     str(bindir), "writable by group")


def test_a_group_writable_pth_file_in_the_venv_is_refused(staff: Staff, base_python: str) -> None:
    venv = staff.root / "venv"
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python3*/site-packages"))
    pth = site / "zz-site.pth"
    pth.write_text(str(Path(__file__).resolve().parents[2] / "src") + "\n")  # gpuslurm importable
    os.chown(pth, 0, staff.gid)
    pth.chmod(0o664)
    # The member appends a line that site.py runs as root in every hook.
    marker = staff.root / "pwned"
    attack = staff.as_member("/bin/sh", "-c", f"echo 'import os; open(\"{marker}\", \"w\")' >> {pth}")
    assert attack.returncode == 0, attack.stderr
    python = str(venv / "bin" / "python")
    refused_one_line(install(etc_dir(staff), staff.root / "libexec", "--python", python),
                     str(pth), "writable by group")
    assert not marker.exists(), "install ran the planted .pth line as root"


def test_a_group_writable_site_packages_is_refused(staff: Staff, base_python: str) -> None:
    venv = staff.root / "venv"
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = staff.staff_dir(next(venv.glob("lib/python3*/site-packages")))
    python = str(venv / "bin" / "python")
    refused_one_line(install(etc_dir(staff), staff.root / "libexec", "--python", python),
                     str(site), "writable by group")


def make_venv(staff: Staff, base_python: str, *extra: str) -> tuple[Path, Path]:
    venv = staff.root / "venv"
    subprocess.run([base_python, "-m", "venv", "--without-pip", *extra, str(venv)], check=True,
                   timeout=120)
    return venv, next(venv.glob("lib/python3*/site-packages"))


def test_a_world_writable_interpreter_file_is_refused(staff: Staff, base_python: str) -> None:
    venv, _ = make_venv(staff, base_python, "--copies")
    python = venv / "bin" / "python3"
    assert not python.is_symlink()
    python.chmod(0o777)
    # The member rewrites the binary every hook runs as root.
    assert staff.as_member("/usr/bin/test", "-w", str(python)).returncode == 0
    refused_one_line(install(etc_dir(staff), staff.root / "libexec", "--python", str(python)),
                     str(python), "writable by every user")


def test_a_writable_module_inside_site_packages_is_refused(staff: Staff, base_python: str) -> None:
    venv, site = make_venv(staff, base_python)
    pkg = site / "evilpkg"
    pkg.mkdir()
    pkg.chmod(0o777)
    init = pkg / "__init__.py"
    init.write_text("")
    init.chmod(0o666)
    marker = staff.root / "pwned"
    attack = staff.as_member("/bin/sh", "-c", f"echo 'open(\"{marker}\", \"w\")' >> {init}")
    assert attack.returncode == 0, attack.stderr
    etc, python = etc_dir(staff), str(venv / "bin" / "python")
    refused_one_line(install(etc, staff.root / "libexec", "--python", python),
                     str(pkg), "writable by every user")
    pkg.chmod(0o755)  # the directory fixed, the file still is not
    refused_one_line(install(etc, staff.root / "libexec", "--python", python),
                     str(init), "writable by every user")
    assert not marker.exists()


def test_a_group_writable_file_in_a_pth_added_directory_is_refused(staff: Staff, base_python: str) -> None:
    venv, site = make_venv(staff, base_python)
    code = staff.root / "code" / "gpuslurm"  # an editable install's src/ tree
    code.mkdir(parents=True)
    (staff.root / "code").chmod(0o755)
    code.chmod(0o755)
    module = code / "hooks.py"
    module.write_text("")
    os.chown(module, 0, staff.gid)
    module.chmod(0o664)
    (site / "_editable.pth").write_text(f"{staff.root / 'code'}\n")
    attack = staff.as_member("/bin/sh", "-c", f"echo 'import os' >> {module}")
    assert attack.returncode == 0, attack.stderr
    python = str(venv / "bin" / "python")
    refused_one_line(install(etc_dir(staff), staff.root / "libexec", "--python", python),
                     str(module), "writable by group")


def test_a_symlink_in_site_packages_to_a_group_writable_file_is_refused(staff: Staff,
                                                                      base_python: str) -> None:
    venv, site = make_venv(staff, base_python)
    shared = staff.staff_dir(staff.root / "shared")
    target = shared / "evil.py"
    target.write_text("")
    (site / "evil.py").symlink_to(target)
    python = str(venv / "bin" / "python")
    refused_one_line(install(etc_dir(staff), staff.root / "libexec", "--python", python),
                     str(shared), "writable by group")


def test_a_root_made_venv_with_pip_packages_is_accepted(staff: Staff, base_python: str) -> None:
    venv = staff.root / "venv"  # with pip: ensurepip lays pip out as root with its usual modes
    subprocess.run([base_python, "-m", "venv", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "zz-src.pth").write_text(str(Path(__file__).resolve().parents[2] / "src") + "\n")
    pkg = site / "somepkg"  # as pip lays a package out under root's umask 022
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    proc = install(etc_dir(staff), staff.root / "libexec", "--python", str(venv / "bin" / "python"))
    assert proc.returncode == 0, proc.stderr
