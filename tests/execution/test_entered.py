"""The reachability recorder sees every entry of its targets: from other threads (3.12+), with
another profile hook or profiler running beside it, and says when its record is incomplete."""

from __future__ import annotations

import sys
import threading

import pytest

from sglfix.execution.entered import record_entries


def target(x):
    return x + 1


def other(x):
    return x * 2


def displace_profiler_then_call():
    """Set a profile hook of its own (as a library may), then enter the target."""
    sys.setprofile(lambda *a: None)
    try:
        return target(1)
    finally:
        sys.setprofile(None)


def test_records_the_targets_entered_and_only_those():
    result, entered = record_entries({target.__code__, other.__code__}, lambda: target(1) + target(2))
    assert result == 5 and entered == {target.__code__}
    assert record_entries({other.__code__}, lambda: target(1)) == (2, set())


@pytest.mark.skipif(sys.version_info < (3, 12), reason="before 3.12 the C profiler sees the calling thread only")
def test_an_entry_from_another_thread_or_under_another_profiler_is_seen():
    import cProfile

    def in_thread():
        t = threading.Thread(target=target, args=(1,))
        t.start()
        t.join()

    assert record_entries({target.__code__}, in_thread)[1] == {target.__code__}
    outer = cProfile.Profile()  # a profiler of the process's own (its tool id is not ours)
    outer.enable()
    try:
        assert record_entries({target.__code__}, lambda: target(1))[1] == {target.__code__}
    finally:
        outer.disable()

    assert record_entries({target.__code__}, displace_profiler_then_call)[1] == {target.__code__}


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12+ records through sys.monitoring: nothing displaces it")
def test_a_displaced_profiler_makes_the_record_incomplete_not_empty():
    result, entered = record_entries({target.__code__}, displace_profiler_then_call)
    assert result == 2 and entered is None
