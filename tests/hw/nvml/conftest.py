"""The replay NVML suite's fixtures: the library built once per session and a node replayed on it
(tests/helpers/nvml_replay.py, where the tests also import its types from)."""

from tests.helpers.nvml_replay import live_node, replay_lib  # noqa: F401  (fixtures of this folder)
