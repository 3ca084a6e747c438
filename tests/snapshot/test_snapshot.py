"""The behaviour snapshot (issue 20's "behaviour is unchanged"): each case of tests/snapshot/record.py
run now and compared with tests/snapshot/golden.json, recorded from main at fbadb85.

The cases: every command and subcommand with ``--json`` (and its table, where a table is printed),
``gres-conf``, ``node-conf``, ``pbs-conf`` and ``pick`` in each of its formats, on each built-in
bundle and each real capture of ../shared/fixtures/real (the multi-command captures imported with
``capture import``, each ``nvidia-smi -q -x`` file as a bundle of that one file), a few commands
that change state and read it back (joined with ``&&``), bad input (a missing bundle, a file where
a directory belongs, an unknown built-in, bad values); and the Slurm prolog, epilog and task
prolog, the PBS hook's begin and end and the classic prologue/epilogue in the fault cases (a
healthy job; an Xid on a job's GPU, as a drain, as ``gpu_out`` with GPUs left and on the last GPU
in service; an invalid job id; a missing map; a planted bug), with what they asked of Slurm
(tests/hooks' stand-in scontrol records it), the job map, the out-of-service record and the
summary's faults.

A command records its exit code, its stdout (parsed where it is JSON) and the first line of its
stderr; a hook its exit code and every line it logged. Commands run in-process (``main()`` as
the ``gpuslurm`` executable calls it: pick without click) in an environment of their own.

Normalised, because they differ between runs and checkouts and are no behaviour of gpuslurm:
- paths: this checkout (``<repo>``), the real captures (``<real>``), the temporary directory of
  the bundles made from them (``<bundles>``) and of each case (``<site>``);
- the run's own clock: a date-time in text, or epoch seconds in JSON, within two days of now
  becomes ``<time>`` (the monitor's sample time, a throttle's start and end, a GPU's time out of
  service); times from recorded data (the report's window) stay;
- the machine's name: the config names the node (``[monitor] node_name = "snapnode"``) and
  every bundle names its own, so nothing reads this host's name; the terminal width and time
  zone are fixed (COLUMNS=100, TZ=UTC).
Nothing else is normalised: a changed message, key, order or exit code fails its case.

On purpose, a change is recorded again: ``python tests/snapshot/record.py --write``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from record import GOLDEN, REAL, RERECORD, World, all_cases, diff, load_golden, record_case, world

pytestmark = pytest.mark.skipif(not REAL.is_dir(), reason=f"{REAL} is absent: the snapshot needs it")


@pytest.fixture(scope="module")
def bundles() -> Iterator[World]:
    with world() as w:
        yield w


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return load_golden()


def test_the_golden_file_has_every_case_and_no_other(golden: dict[str, Any]) -> None:
    missing = sorted(set(all_cases()) - set(golden))
    extra = sorted(set(golden) - set(all_cases()))
    assert not missing and not extra, (f"{GOLDEN.name}: cases not recorded {missing}, recorded but gone "
                                       f"{extra}; {RERECORD}")


@pytest.mark.parametrize("case", all_cases() if REAL.is_dir() else [])
def test_behaviour_is_as_recorded(case: str, bundles: World, golden: dict[str, Any]) -> None:
    got = record_case(case, bundles)
    want = golden.get(case)
    if got != want:
        pytest.fail(f"behaviour changed: {case}\n{diff(case, want, got)}\n{RERECORD}", pytrace=False)
