"""report.data.Sparse: a series held only where it lives reads as the dense series it stands for."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslurm.report.compute import _seen_range
from gpuslurm.report.data import Sparse


@st.composite
def _sparse(draw: st.DrawFn) -> tuple[Sparse[float], tuple[float, ...]]:
    n = draw(st.integers(1, 60))
    first = draw(st.integers(0, n - 1))
    values = draw(st.lists(st.sampled_from([0.0, 0.25, 1.0]), min_size=1, max_size=n - first))
    dense = (0.0,) * first + tuple(values) + (0.0,) * (n - first - len(values))
    return Sparse(n, first, values, 0.0), dense


@given(_sparse())
def test_a_sparse_series_reads_as_its_dense_one(case: tuple[Sparse[float], tuple[float, ...]]) -> None:
    sparse, dense = case
    assert len(sparse) == len(dense) and tuple(sparse) == dense and sparse == dense
    assert [sparse[i] for i in range(len(dense))] == list(dense)
    assert sparse[-1] == dense[-1] and sum(sparse) == sum(dense)
    assert _seen_range(sparse) == _seen_range(dense)


@pytest.mark.parametrize("bad", [5, -6])
def test_an_index_outside_the_window_is_an_error(bad: int) -> None:
    with pytest.raises(IndexError):
        Sparse(5, 2, (1.0,), 0.0)[bad]
