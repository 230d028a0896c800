"""The detection table of the real-sglang profile: every part of every toggle is detected by a
built-in scenario on the device where it can be (an expectation with a failing verdict), or is
marked static-only with the reason. The CPU matrix that checks those expectations is the README's
sglang command, which CI runs."""

from __future__ import annotations

from sglfix.scenario import load_scenarios
from sglfix.toggling.profiles import PROFILES
from sglfix.toggling.registry import load_registry

PROFILE = PROFILES["sglang-0.5.23"]
# Parts no machine of this project can detect, with the reason (not a scenario's fault).
UNDETECTABLE = {
    "27360": "FlashAttentionBackend (FA3) runs sgl_kernel's CUDA kernels, which sglfix never carries; "
    "doctor checks that the revert applies",
}
# A size check can only fire on an undersized buffer: with sizing reverted alone the check stops
# the launch (CRASH), with both parts reverted the overflow is silent (INVARIANT). The whole id's
# expectation against the sizing part's is what detects the check.
IN_COMBINATION = {"27338:assert": ("27338", "27338:sizing"), "27460:assert": ("27460", "27460:sizing")}
# Detected on the GPU only (the rest on CPU).
GPU_ONLY = {"21987", "21987:uniform-stride", "21987:fixed-max-sum", "21987:no-cpu-fast-path"}


def _detections() -> dict[str, set[str]]:
    registry = load_registry(PROFILE.toggles_dir)
    found: dict[str, set[str]] = {}
    for toggle in registry:
        for e in toggle.expect:
            if set(e.verdicts) - {"PASS", "NOT_REACHED"}:
                for rid in e.revert:
                    found.setdefault(rid, set()).add(e.device)
    return found


def test_every_part_is_detected_by_a_builtin_scenario_or_marked_static_only():
    registry = load_registry(PROFILE.toggles_dir)
    found = _detections()
    missing = []
    for toggle in registry:
        single = len(toggle.parts) == 1
        for name, part in toggle.parts.items():
            pid = str(toggle.pr) if single else f"{toggle.pr}:{name}"
            if part.static_only or pid in UNDETECTABLE:
                continue
            devices = found.get(pid, set())
            if pid in IN_COMBINATION:
                both, alone = IN_COMBINATION[pid]
                verdicts = {
                    r: {v for e in toggle.expect if e.revert == (r,) for v in e.verdicts} for r in (both, alone)
                }
                if verdicts[both] - {"PASS"} and verdicts[alone] - {"PASS"} and verdicts[both] != verdicts[alone]:
                    devices = devices | found.get(both, set())
            where = "cuda" if pid in GPU_ONLY else "cpu"
            if not devices & {where, "any"}:
                missing.append(f"{pid} (wanted on {where}, found {sorted(devices) or 'none'})")
    assert not missing, "parts no built-in scenario detects: " + "; ".join(missing)


def test_each_detection_names_builtin_scenarios():
    import fnmatch

    names = [s.name for s in load_scenarios(builtin_dir=PROFILE.scenarios_dir)]
    for toggle in load_registry(PROFILE.toggles_dir):
        for e in toggle.expect:
            assert any(fnmatch.fnmatchcase(n, e.scenario) for n in names), (toggle.pr, e.scenario)


def test_static_only_parts_say_why():
    registry = load_registry(PROFILE.toggles_dir)
    marked = {f"{t.pr}:{n}": p.static_only for t in registry for n, p in t.parts.items() if p.static_only}
    assert set(marked) == {"26239:worker-helper", "26513:window"}, marked
    assert all(len(reason.split()) > 8 for reason in marked.values())
