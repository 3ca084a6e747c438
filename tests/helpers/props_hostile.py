"""Strategies for hostile text: real inputs with pieces replaced by what broke gpuslurm before."""

from __future__ import annotations

from hypothesis import strategies as st

# Each of these ended a run in exit 70, a hang or a split message before issue 9.
PIECES = (
    "56-18446744073709551616", "0-99999999999", "[0-99999999999]", "[4-]", "[0-1e308]", "[", "]",
    "-1", "nan", "inf", "Infinity", "NaN", "1e308", "9" * 40, "\u2028", "\x85", "\r", "\v", "\x00",
    "{}", "[]", "null", "true", '"lots"', "²", "١٢", ",,", "0-", "3-1", "\ufffd", "\t", "\n",
)

piece = st.one_of(st.sampled_from(PIECES), st.text(max_size=12))


@st.composite
def mutated(draw: st.DrawFn, base: str, edits: int = 3) -> str:
    """``base`` with up to ``edits`` spans replaced by a hostile piece or random text."""
    text = base
    for _ in range(draw(st.integers(0, edits))):
        start = draw(st.integers(0, len(text)))
        end = draw(st.integers(start, min(len(text), start + 20)))
        text = text[:start] + draw(piece) + text[end:]
    return text


def one_line(message: str) -> bool:
    return len(message.splitlines()) == 1 and message.strip() != ""
