"""Node names written into gres.conf, slurm.conf lines and scontrol: no line or key injection."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuslurm.errors import InputError
from gpuslurm.names import check_node_name

INJECTIONS = ["gpu01\nNodeName=gpu02 Name=gpu File=/dev/nvidia0", "gpu01 Name=gpu", "gpu01#x",
              "gpu01=x", "", "-gpu", "gpu\t1", "gpu\u20281", "gp\u00fc", "a" * 65, "gpu[0-3]\n"]


def run(*args: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "gpuslurm", *args], capture_output=True, text=True,
                          timeout=60)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("name", ["gpu01", "node-7.cluster", "a100_mig01", "A" * 64])
def test_slurm_host_names_pass(name: str) -> None:
    assert check_node_name(name) == name == check_node_name(name, hostlist=True)


@pytest.mark.parametrize("name", ["gpu[01-04]", "gpu[1,3-5],login1", "rack1-[1-2]n[3-4]"])
def test_host_lists_pass_only_where_a_list_is_taken(name: str) -> None:
    assert check_node_name(name, hostlist=True) == name
    with pytest.raises(InputError):
        check_node_name(name)


@pytest.mark.parametrize("name", [*INJECTIONS, "gpu[", "gpu[a-b]", "gpu,,x", "gpu[1-2]]"])
def test_anything_else_is_refused_on_one_line(name: str) -> None:
    for hostlist in (False, True):
        with pytest.raises(InputError) as exc:
            check_node_name(name, hostlist=hostlist)
        assert "\n" not in str(exc.value) and "\u2028" not in str(exc.value)


@pytest.mark.parametrize("command", [["gres-conf", "--from", "dgx-h100", "--node-name"],
                                     ["node-conf", "--from", "dgx-h100", "--node-name"]])
@pytest.mark.parametrize("name", ["gpu01\nNodeName=evil Name=gpu File=/dev/nvidia0", "gpu01 Name=gpu"])
def test_a_node_name_cannot_inject_lines_into_the_written_file(command: list[str], name: str,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "out.conf"
    extra = ["--output", str(out)] if command[0] == "gres-conf" else []
    code, stdout, err = run(*command, name, *extra)
    assert code == 2 and stdout == "" and len(err.splitlines()) == 1, (code, err)
    assert "not a node name" in err
    assert not out.exists()


def test_mig_apply_refuses_a_bad_node_before_anything(tmp_path: Path) -> None:
    layout = tmp_path / "layout.toml"
    layout.write_text('[gpus.all]\nprofiles = ["3g.40gb", "3g.40gb"]\n')
    for opt in ("--node", "--gres-node-name"):
        code, _, err = run("mig", "apply", str(layout), "--from", "a100-mig", "--dry-run", opt, "n1\nn2")
        assert code == 2 and len(err.splitlines()) == 1 and "not a node name" in err, err
