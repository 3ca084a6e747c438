from __future__ import annotations

import pathlib

import pytest

from gpuslurm.config import Config, load_config, parse_config
from gpuslurm.errors import EXIT_BAD_INPUT, InputError


def test_defaults() -> None:
    d = Config().detect
    assert (d.idle.threshold_pct, d.idle.window_s, d.share.threshold_pct, d.share.duration_s) == (
        5.0, 1800.0, 80.0, 600.0)
    assert d.share.default_quota == 1.0 and d.share.users == () and d.share.quota_source == "config"
    assert d.defensive.fraction == 0.3 and d.defensive.kinds == ("rogue", "idle", "over-share")


def test_quota_tables_inline_or_as_tables() -> None:
    cfg = parse_config('[detect.share]\nusers = { bob = 1, alice = 0.3 }\n'
                       '[detect.share.accounts]\nphysics = 0.5\n"dept-x" = 0\n').detect.share
    assert cfg.users == (("alice", 0.3), ("bob", 1.0))  # sorted, and every value a float
    assert all(isinstance(q, float) for _, q in cfg.users)
    assert cfg.accounts == (("dept-x", 0.0), ("physics", 0.5))


def test_values_are_read() -> None:
    d = parse_config('[detect.rogue]\nexempt_users = ["dcgm"]\n'
                     '[detect.idle]\nthreshold_pct = 0\nwindow_s = 60\ngrace_s = 0\nmin_samples = 1\n'
                     'min_coverage = 1\n[detect.share]\nquota_source = "slurm"\n'
                     '[detect.defensive]\nkinds = []\nidle_threshold_factor = 1\n').detect
    assert d.rogue.exempt_users == ("dcgm",)
    assert d.idle == d.idle._replace(threshold_pct=0.0, window_s=60.0, grace_s=0.0, min_samples=1,
                                     min_coverage=1.0)
    assert d.share.quota_source == "slurm" and d.defensive.kinds == ()


@pytest.mark.parametrize(("text", "message"), [
    ("[detect]\nrogue = 1\n", "[detect.rogue] must be a table, not 1"),
    ("[detect.rogue]\nexempt = []\n", "unknown key 'exempt' in [detect.rogue]"),
    ("[detect.rogue]\nenabled = 'yes'\n", "enabled in [detect.rogue] must be true or false, not 'yes'"),
    ("[detect.rogue]\nexempt_users = 'dcgm'\n", "exempt_users in [detect.rogue] must be a list, not 'dcgm'"),
    ("[detect.rogue]\nexempt_users = [990]\n",
     "exempt_users in [detect.rogue] (item 1) must be a string, not 990"),
    ("[detect.idle]\nenabled = 1\n", "enabled in [detect.idle] must be true or false, not 1"),
    ("[detect.idle]\nthreshold_pct = 101\n",
     "threshold_pct in [detect.idle] must be between 0 and 100, not 101.0"),
    ("[detect.idle]\nthreshold_pct = -1\n",
     "threshold_pct in [detect.idle] must be between 0 and 100, not -1.0"),
    ("[detect.idle]\nwindow_s = 0\n", "window_s in [detect.idle] must be between 1 and 604800, not 0.0"),
    ("[detect.idle]\nwindow_s = '30m'\n", "window_s in [detect.idle] must be a number, not '30m'"),
    ("[detect.idle]\ngrace_s = -5\n", "grace_s in [detect.idle] must be between 0 and 604800, not -5.0"),
    ("[detect.idle]\nmin_samples = 0\n",
     "min_samples in [detect.idle] must be between 1 and 100000, not 0"),
    ("[detect.idle]\nmin_samples = 2.5\n", "min_samples in [detect.idle] must be an integer, not 2.5"),
    ("[detect.idle]\nmin_coverage = 1.5\n",
     "min_coverage in [detect.idle] must be between 0 and 1, not 1.5"),
    ("[detect.idle]\nthreshold = 5\n", "unknown key 'threshold' in [detect.idle]"),
    ("[detect.share]\nenabled = 'no'\n", "enabled in [detect.share] must be true or false, not 'no'"),
    ("[detect.share]\nthreshold_pct = 180\n",
     "threshold_pct in [detect.share] must be between 0 and 100, not 180.0"),
    ("[detect.share]\nduration_s = 0.5\n",
     "duration_s in [detect.share] must be between 1 and 604800, not 0.5"),
    ("[detect.share]\nmin_samples = -1\n",
     "min_samples in [detect.share] must be between 1 and 100000, not -1"),
    ("[detect.share]\nmin_coverage = -0.1\n",
     "min_coverage in [detect.share] must be between 0 and 1, not -0.1"),
    ("[detect.share]\nquota_source = 'sshare'\n",
     "quota_source in [detect.share] must be one of config, slurm, not 'sshare'"),
    ("[detect.share]\ndefault_quota = 2\n",
     "default_quota in [detect.share] must be between 0 and 1, not 2.0"),
    ("[detect.share]\nusers = ['alice']\n", "users in [detect.share] must be a table, not a list"),
    ("[detect.share]\nusers = { alice = 1.5 }\n",
     "'alice' in [detect.share.users] must be between 0 and 1, not 1.5"),
    ("[detect.share.users]\nalice = '30%'\n",
     "'alice' in [detect.share.users] must be a number, not '30%'"),
    ("[detect.share]\naccounts = 0.5\n", "accounts in [detect.share] must be a table, not 0.5"),
    ("[detect.share.accounts]\nphysics = { gpu = 1 }\n",
     "'physics' in [detect.share.accounts] must be a number, not a table"),
    ("[detect.defensive]\nenabled = 0\n", "enabled in [detect.defensive] must be true or false, not 0"),
    ("[detect.defensive]\nfraction = 1.1\n",
     "fraction in [detect.defensive] must be between 0 and 1, not 1.1"),
    ("[detect.defensive]\nwindow_s = 0\n",
     "window_s in [detect.defensive] must be between 1 and 604800, not 0.0"),
    ("[detect.defensive]\nlookback_s = 0\n",
     "lookback_s in [detect.defensive] must be between 1 and 2592000, not 0.0"),
    ("[detect.defensive]\nkinds = ['hog']\n",
     "kinds in [detect.defensive] (item 1) must be one of rogue, idle, over-share, not 'hog'"),
    ("[detect.defensive]\nidle_threshold_factor = 0.5\n",
     "idle_threshold_factor in [detect.defensive] must be between 1 and 100, not 0.5"),
    ("[detect.defensive]\nidle_window_factor = 2\n",
     "idle_window_factor in [detect.defensive] must be between 0.01 and 1, not 2.0"),
    ("[detect.defensive]\nshare_threshold_factor = 0\n",
     "share_threshold_factor in [detect.defensive] must be between 0.01 and 1, not 0.0"),
    ("[detect.defensive]\nshare_duration_factor = 1.5\n",
     "share_duration_factor in [detect.defensive] must be between 0.01 and 1, not 1.5"),
    ("[detect.defensive]\nlookback = 60\n", "unknown key 'lookback' in [detect.defensive]"),
    ("[detect.hogs]\n", "unknown key 'hogs' in [detect]"),
])
def test_mistakes_are_one_line_input_errors(tmp_path: pathlib.Path, text: str, message: str) -> None:
    path = tmp_path / "gpuslurm.toml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_config(str(path))
    assert info.value.message == message
    assert str(info.value) == f"{path}: {message}"
    assert info.value.exit_code == EXIT_BAD_INPUT
