"""policy.admission on replayed load curves: rising, flapping, falling (hand-worked expectations).

8 GPUs; the load is what the users hold (``usage``), as slurmctld reports it. Fair share is 8
split among the users holding GPUs. Back-off 300 s, at most 1200 s.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.policy.admission import NO_TIER, AdmissionConfig, AdmissionState, step, tier_for, tier_limit

CFG = AdmissionConfig(backoff_s=300, backoff_max_s=1200)
GPUS = 8
Reading = tuple[float, dict[str, int]]


Outcome = tuple[AdmissionState, dict[str, int | None]]


def replay(readings: list[Reading], state: AdmissionState | None = None) -> list[Outcome]:
    """Per reading: the state after it and the changes made (user → limit, None for lifted)."""
    state = state or AdmissionState()
    out = []
    for now, usage in readings:
        load = sum(usage.values()) / GPUS
        state, changes, _notes = step(state, load=load, usage=usage, total_gpus=GPUS, now=now, cfg=CFG)
        out.append((state, {c.user: c.limit for c in changes}))
    return out


def test_tiers_and_their_gpu_counts() -> None:
    loads = (0.0, 0.3, 0.31, 0.7, 0.71, 1.0)
    assert [tier_for(x, CFG.tiers) for x in loads] == [NO_TIER, NO_TIER, 0, 0, 1, 1]
    assert [tier_limit(t, 8, CFG.tiers) for t in (NO_TIER, 0, 1)] == [None, 4, 1]  # 50 % and 10 % of 8
    assert [tier_limit(t, 64, CFG.tiers) for t in (0, 1)] == [32, 7]  # 10 % of 64 is 6.4: 7
    assert tier_limit(1, 4, CFG.tiers) == 1  # never 0: a limited user can still run on one GPU


def test_rising() -> None:
    got = replay([
        (0, {"alice": 2}),  # 25 %: no tier
        (60, {"alice": 5}),  # 62.5 %: tier 50 %; alice alone holds GPUs, fair share 8: not above
        (120, {"alice": 5, "bob": 1}),  # 75 %: tier 10 % → 1 GPU; fair 4: alice above, bob not
        (180, {"alice": 5, "bob": 1, "carol": 2}),  # still 10 %; fair 2.7: none new above it
    ])
    assert [s.tier for s, _ in got] == [NO_TIER, 0, 1, 1]
    assert [c for _, c in got] == [{}, {}, {"alice": 1}, {}]
    assert got[-1][0].limits == (("alice", 1),)


def test_root_is_never_limited() -> None:
    (state, changes), = replay([(0, {"root": 6, "bob": 1})])
    assert state.tier == 1 and changes == {}


def test_falling_waits_for_the_backoff_and_eases_one_step_at_a_time() -> None:
    high = (0, {"alice": 6, "bob": 1})  # 87.5 %: alice limited to 1
    got = replay([high, (100, {"alice": 3, "bob": 1}),  # 50 %: below 70 % since 100
                  (350, {"alice": 3, "bob": 1}),  # only 250 s: hold
                  (400, {"alice": 3, "bob": 1}),  # 300 s: ease to 50 % → alice's limit becomes 4
                  (500, {"alice": 1}),  # 12.5 %: below 30 % since 500
                  (799, {"alice": 1}),  # 299 s: hold
                  (800, {"alice": 1})])  # ease to none: lift
    assert [s.tier for s, _ in got] == [1, 1, 1, 0, 0, 0, NO_TIER]
    assert [c for _, c in got] == [{"alice": 1}, {}, {}, {"alice": 4}, {}, {}, {"alice": None}]
    assert got[-1][0].limits == ()


def test_a_dip_shorter_than_the_backoff_eases_nothing() -> None:
    got = replay([(0, {"alice": 6, "bob": 1}), (100, {"alice": 1}), (200, {"alice": 6, "bob": 1}),
                  (450, {"alice": 1}), (700, {"alice": 1})])
    assert [s.tier for s, _ in got] == [1, 1, 1, 1, 1]  # low 100-200 and 450-700: never 300 s
    assert got[-1][0].backoff_s == 300  # no easing, so no flap


def test_flapping_doubles_the_backoff_up_to_its_bound_and_calm_restores_it() -> None:
    low, high = {"alice": 1}, {"alice": 6, "bob": 1}
    got = replay([(0, high), (10, low), (310, low),  # eased to none at 310 (300 s low)
                  (400, high),  # back up 90 s after easing: flap, back-off 600
                  (410, low), (1009, low), (1010, low),  # eased at 1010 after 600 s
                  (1100, high),  # flap: 1200
                  (1110, low), (2310, low),  # eased at 2310
                  (2400, high),  # flap: would be 2400, bound 1200
                  (2410, low), (3610, low),  # eased at 3610
                  (3700, low), (4810, low), (4900, high)])  # the easing at 3610 held 1200 s: calm, 300
    tiers = [s.tier for s, _ in got]
    backoffs = [s.backoff_s for s, _ in got]
    assert tiers == [1, 1, NO_TIER, 1, 1, 1, NO_TIER, 1, 1, NO_TIER, 1, 1, NO_TIER, NO_TIER, NO_TIER, 1]
    assert backoffs[3] == 600 and backoffs[7] == 1200 and backoffs[10] == 1200
    assert backoffs[14] == 300 and backoffs[15] == 300  # calm for one back-off: base again, no flap
    assert got[15][1] == {"alice": 1}


def test_a_limited_user_stays_limited_while_the_tier_holds() -> None:
    got = replay([(0, {"alice": 6, "bob": 1}), (60, {"alice": 1, "bob": 5, "carol": 1})])
    assert got[0][1] == {"alice": 1}
    assert got[1][1] == {"bob": 1}  # bob now above fair share; alice stays limited
    assert got[1][0].limits == (("alice", 1), ("bob", 1))


_usage = st.dictionaries(st.sampled_from(["alice", "bob", "carol", "dave", "root"]), st.integers(0, 8),
                         max_size=5).filter(lambda u: sum(u.values()) <= GPUS)


@given(st.lists(st.tuples(st.floats(0, 1000), _usage), min_size=1, max_size=30))
def test_invariants(steps: list[tuple[float, dict[str, int]]]) -> None:
    """Whatever the curve: limits only in a tier and all of that tier's size, none on root, none
    left when there is no tier, the back-off within its bounds; every change has its figures."""
    now, state = 0.0, AdmissionState()
    for dt, usage in steps:
        now += dt
        state, changes, _ = step(state, load=sum(usage.values()) / GPUS, usage=usage, total_gpus=GPUS,
                                 now=now, cfg=CFG)
        limit = tier_limit(state.tier, GPUS, CFG.tiers)
        assert all(n == limit for _, n in state.limits)
        assert "root" not in dict(state.limits)
        assert state.tier != NO_TIER or state.limits == ()
        assert CFG.backoff_s <= (state.backoff_s or CFG.backoff_s) <= CFG.backoff_max_s
        assert all("load " in c.why and "GPUs" in c.why for c in changes)


def test_band_controller_moves_the_tier_limit() -> None:
    from gpuslurm.policy.admission import band_limit, check_band

    assert [band_limit(4, 8, u, CFG) for u in (None, 0.6, 0.7, 0.8)] == [4, 4, 4, 4]  # in the band
    assert band_limit(4, 8, 0.3, CFG) == 5  # 1 + 0.5 × (0.6 − 0.3) / 0.6 = 1.25
    assert band_limit(4, 8, 0.0, CFG) == 6  # 1.5
    assert band_limit(4, 8, 0.9, CFG) == 3  # 1 − 0.5 × (0.9 − 0.8) / 0.2 = 0.75
    assert band_limit(4, 8, 1.0, CFG) == 2  # 0.5
    assert band_limit(1, 8, 1.0, CFG) == 1 and band_limit(8, 8, 0.0, CFG) == 8  # within 1 .. the GPUs
    assert band_limit(4, 8, 0.0, CFG._replace(gain=0)) == 4
    check_band(0.6, 0.8)
    for low, high in ((0.8, 0.6), (-0.1, 0.5), (0.5, 1.1)):
        try:
            check_band(low, high)
        except ValueError:
            continue
        raise AssertionError((low, high))


def test_utilisation_moves_a_held_limit_and_is_in_the_figures() -> None:
    usage = {"alice": 3, "bob": 1, "carol": 1}  # 62.5 %: tier 50 % (N 4); fair share 2.7: alice above
    state = AdmissionState()
    limits = []
    for now, util in ((0, 0.7), (60, 0.3), (120, 0.9), (180, None)):
        state, changes, _ = step(state, load=5 / 8, usage=usage, total_gpus=8, now=now, cfg=CFG,
                                 utilisation=util)
        limits.append([(c.user, c.limit) for c in changes])
        if util is not None and changes:
            assert f"utilisation {util:.0%}" in changes[0].why
    assert limits == [[("alice", 4)], [("alice", 5)], [("alice", 3)], [("alice", 4)]]
