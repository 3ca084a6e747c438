"""The task file's format (:mod:`gpuslurm.state.taskinfo`): what the prolog writes reads back the
same, and any other text is one InputError, never another exception or a device it did not hold."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.errors import InputError
from gpuslurm.state.taskinfo import HEADER, TaskDevice, TaskInfo

WORD = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40)
UUID = WORD.filter(lambda w: w != "-")
NUMBER = st.one_of(st.none(), st.integers(min_value=-1, max_value=10**9))
ALIASES = st.lists(UUID.filter(lambda w: "," not in w), max_size=3).map(tuple)
DEVICE = st.builds(TaskDevice, UUID, NUMBER, ALIASES, NUMBER, st.one_of(st.just(""), UUID))
INFO = st.builds(TaskInfo, st.integers(min_value=1, max_value=2**32 - 1).map(str),
                 st.integers(min_value=0, max_value=2**32 - 2), st.lists(DEVICE, max_size=8).map(tuple))


@given(INFO)
def test_what_the_prolog_writes_reads_back_the_same(info: TaskInfo) -> None:
    assert TaskInfo.from_text(info.to_text(), "t") == info


@given(st.text(max_size=400))
def test_any_text_is_a_task_info_or_one_input_error(text: str) -> None:
    try:
        info = TaskInfo.from_text(text, "t")
    except InputError:
        return
    assert TaskInfo.from_text(info.to_text(), "t") == info


EDITS = st.sampled_from([" ", "\n", "\t", "\x00", ",", "-", "x"])


@given(INFO, st.integers(min_value=0, max_value=400), EDITS)
def test_a_changed_character_is_refused_or_reads_as_what_it_says(info: TaskInfo, at: int, char: str) -> None:
    text = info.to_text()
    edited = text[:at] + char + text[at + 1:]
    try:
        parsed = TaskInfo.from_text(edited, "t")
    except InputError:
        return
    assert TaskInfo.from_text(parsed.to_text(), "t") == parsed
    assert len(parsed.devices) == len(info.devices)  # an edit never adds or drops a device


def test_examples() -> None:
    info = TaskInfo("7", 1000, (TaskDevice("GPU-a", 0, ("MIG-GPU-a/1/0",), 1, "0-55,112-167"),
                                TaskDevice("GPU-b")))
    assert info.to_text() == (f"{HEADER}\njob 7\nuid 1000\ndevice GPU-a 0 1 0-55,112-167 MIG-GPU-a/1/0\n"
                              "device GPU-b - - - -\n")
    for bad in ("", f"{HEADER}\njob 7\n", f"{HEADER}\njob 7\nuid 1\nuid 2\n", f"{HEADER}\njob 7\nuid 1",
                f"{HEADER}\njob 7\nuid 1\ndevice GPU-a 0 1 -\n", f"{HEADER}\njob x\nuid 1\n",
                f"{HEADER}\njob 7\nuid 99999999999\n", f"{HEADER}\njob 7\nuid 1\ndevice  GPU-a 0 1 - -\n",
                "gpuslurm-tasks 1\njob 7\nuid 1\n", f"{HEADER}\njob 7\nuid 1\nexport X=1\n"):
        with pytest.raises(InputError):
            TaskInfo.from_text(bad, "t")
    for value in ("GPU a", "GPU-\n", ""):
        with pytest.raises(ValueError):
            TaskInfo("7", 1, (TaskDevice(value),)).to_text()
