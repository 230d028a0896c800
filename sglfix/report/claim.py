"""A regression test's claim to guard a fix (``@pytest.mark.fixed_by``), judged from the test's
outcome with the fix in place and with it reverted: caught only when it passes with the fix and
fails without it. Part of the one judgement (``sglfix.report.outcome``); imports nothing of sglfix."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["TEST_OUTCOMES", "Claim", "judge_claim"]


class Claim(StrEnum):
    """A fix claim (``@pytest.mark.fixed_by``) checked by running the test both ways."""

    CAUGHT = "caught"  # passes with the fix, fails with it reverted: the test guards the fix
    NOT_CAUGHT = "not-caught"  # passes with the fix reverted: the test does not see the bug
    INCONCLUSIVE = "inconclusive"  # fails with the fix in place too: the revert proves nothing
    NOT_RUN = "not-run"  # skipped or xfail: it cannot show the revert either way
    ERROR = "error"  # the revert could not be applied: sglfix failed, nothing was tested

    @property
    def fails_session(self) -> bool:
        """A claim that is not caught, or could not be tried, fails the session."""
        return self in (Claim.NOT_CAUGHT, Claim.ERROR)


# What a run of the test gave: pytest's outcome of its phases taken together.
TEST_OUTCOMES = ("passed", "failed", "skipped", "xfail", "error")


def judge_claim(*, fixed: str, reverted: str) -> tuple[Claim, str]:
    """The claim's outcome and why, from the test's outcome with the fix in place (``fixed``) and
    with it reverted (``reverted``), each one of ``TEST_OUTCOMES`` (``error`` for the reverted
    run: the revert could not be applied)."""
    for name, value in (("fixed", fixed), ("reverted", reverted)):
        if value not in TEST_OUTCOMES:
            raise ValueError(f"{name}={value!r}: not one of {', '.join(TEST_OUTCOMES)}")
    if reverted == "error":
        return Claim.ERROR, "the revert could not be applied"
    if reverted in ("skipped", "xfail"):
        return Claim.NOT_RUN, f"{reverted} with the fix reverted: it cannot show the revert"
    if fixed in ("skipped", "xfail"):
        return Claim.NOT_RUN, f"{fixed} with the fix in place: it cannot show the revert"
    if reverted == "passed":
        return Claim.NOT_CAUGHT, "passed with the fix reverted"
    if fixed != "passed":
        return Claim.INCONCLUSIVE, "fails with the fix in place too: failing with it reverted proves nothing"
    return Claim.CAUGHT, "passes with the fix in place, fails with it reverted"
