"""The search space: drawn from the scenario schema (bounds and choices read from the pydantic
types, keys from the mode, backend and probe tables), every example one the code base takes, the
same examples for the same seed, and every backend mode and probe each code base runs within reach."""

from __future__ import annotations

import collections

import pytest

from sglfix.codebases import check_scenarios_runnable, get_codebase
from sglfix.common.errors import ConfigError
from sglfix.scenario.limits import MAX_DRAFT_TOKENS, MAX_PAGE_SIZE, MAX_TOKENS_PER_REQUEST
from sglfix.scenario.models import DTYPES, BatchNode, ModelShape, ScenarioNode, SpecShape
from sglfix.scenario.modes import BACKENDS, MODES, PROBES
from sglfix.search.schema_types import field_kind
from sglfix.search.space import examples, kinds, space_for, to_scenario

PROFILES = ("reproduction", "sglang-0.5.23")


def test_bounds_and_choices_are_the_schemas_own():
    assert field_kind(ScenarioNode, "backend").choices == BACKENDS
    assert field_kind(ScenarioNode, "mode").choices == MODES
    assert field_kind(ScenarioNode, "probe").choices == PROBES
    assert field_kind(ModelShape, "dtype").choices == DTYPES
    page = field_kind(ScenarioNode, "page_size")
    assert (page.low, page.high, page.optional) == (1, MAX_PAGE_SIZE, True)
    prefix = field_kind(BatchNode, "prefix_lens")
    assert (prefix.low, prefix.high, prefix.per_request) == (0, MAX_TOKENS_PER_REQUEST, True)
    assert field_kind(BatchNode, "extend_lens").low == 1
    assert field_kind(BatchNode, "accept_lens").high == MAX_DRAFT_TOKENS
    assert field_kind(ModelShape, "head_dim").power_of_two
    assert field_kind(ModelShape, "cross_attention").flag
    assert not field_kind(SpecShape, "topk").optional


@pytest.mark.parametrize("field", ["page_size", "dcp_size"])
def test_a_bound_read_is_the_bound_validation_enforces(field):
    # One past the bound read from the type is what the schema refuses, the bound itself it takes.
    kind = field_kind(ScenarioNode, field)
    base = {"name": "x", "mode": "DECODE", "batch": {"prefix_lens": [1]}}
    with pytest.raises(Exception, match="over the limit"):
        ScenarioNode.model_validate({**base, field: kind.high + 1})
    with pytest.raises(Exception, match=f">= {kind.low}"):
        ScenarioNode.model_validate({**base, field: kind.low - 1})


@pytest.mark.parametrize("profile", PROFILES)
def test_every_example_is_a_scenario_the_code_base_runs_and_the_seed_fixes_them(profile):
    cb = get_codebase(profile)
    space = space_for(cb)
    drawn = examples(space, count=60, seed=5)
    assert len(drawn) == 60
    for node, scenario in drawn:
        # As a scenario file: the same validation again, and runnable here.
        assert to_scenario(node, codebase=cb) == scenario
        check_scenarios_runnable([scenario], cb)
    again = examples(space, count=60, seed=5)
    assert [s.name for _, s in again] == [s.name for _, s in drawn]
    other = examples(space, count=60, seed=6)
    assert [s.name for _, s in other] != [s.name for _, s in drawn]
    # A larger budget tries these first: a find of a small search is a find of a larger one.
    more = examples(space, count=100, seed=5)
    assert [s.name for _, s in more[:60]] == [s.name for _, s in drawn]


@pytest.mark.parametrize("profile", PROFILES)
def test_every_mode_of_every_backend_and_every_probe_is_drawn_in_turn(profile):
    cb = get_codebase(profile)
    space = space_for(cb)
    every = kinds(space)
    # What the code base's adapters and probes run, the format's modes less what it lacks.
    assert {b for b, _ in every} | {p for p, _ in every} == set(space.backends) | set(space.probes)
    assert set(space.backends) == {b for b in BACKENDS if b in cb.adapters}
    seen = collections.Counter((s.backend or s.probe, s.mode) for _, s in examples(space, count=2 * len(every), seed=0))
    assert seen == dict.fromkeys(every, 2)


def test_edges_are_drawn_graph_padding_and_page_boundaries():
    cb = get_codebase("sglang-0.5.23")
    drawn = [s for _, s in examples(space_for(cb, family="triton"), count=200, seed=2)]
    assert any(s.padded for s in drawn)
    assert any(s.cuda_graph and not s.padded for s in drawn)
    assert any(
        s.page_size > 1 and any(p % s.page_size in (0, 1, s.page_size - 1) and p > 0 for p in s.prefix_lens)
        for s in drawn
    )
    assert any(s.model.sliding_window is not None for s in drawn)
    assert any(s.max_context_len is not None for s in drawn)
    # Chain drafting, and the draft-token count a server sets (a chain's steps + 1), as edges.
    specs = [s.spec for s in drawn if s.spec is not None]
    chains = [sp for sp in specs if sp.topk == 1]
    assert len(chains) >= len(specs) // 4, (len(chains), len(specs))
    assert sum(sp.num_draft_tokens == sp.num_steps + 1 for sp in chains) >= len(chains) // 4


def test_family_and_mode_narrow_the_space():
    cb = get_codebase("sglang-0.5.23")
    drawn = [s for _, s in examples(space_for(cb, family="flashinfer", mode="target-verify"), count=30, seed=1)]
    assert {(s.backend, s.mode) for s in drawn} == {("flashinfer", "TARGET_VERIFY")}
    probes = [s for _, s in examples(space_for(cb, family="probes"), count=30, seed=1)]
    assert all(s.probe is not None for s in probes)


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        (
            {"family": "flashinfr"},
            "--family flashinfr: sglang-0.5.23 has no such backend family (did you mean 'flashinfer'?)",
        ),
        ({"mode": "decod"}, "--mode decod: no such mode (did you mean 'DECODE'?)"),
        ({"family": "torch_native", "mode": "TARGET_VERIFY"}, "no torch_native of sglang-0.5.23 runs it"),
    ],
)
def test_a_bad_family_or_mode_is_one_line_naming_it(given, needle):
    with pytest.raises(ConfigError) as err:
        space_for(get_codebase("sglang-0.5.23"), **given)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_where_pins_hold_in_every_example_and_the_shrinker_keeps_them():
    """--where KEY=VALUE: every drawn scenario holds the pinned keys, and a reduction that would
    change one (a smaller page, a smaller topk, the key left out) is not a scenario of the space."""
    from sglfix.search.shrink import reductions
    from sglfix.search.space import parse_pins

    cb = get_codebase("sglang-0.5.23")
    pins = parse_pins(["spec.topk=1", "page_size=16"])
    space = space_for(cb, family="probes", mode="DECODE", pins=pins)
    drawn = examples(space, count=16, seed=0)
    assert drawn
    for node, scenario in drawn:
        assert node["spec"]["topk"] == 1 and node["page_size"] == 16, node
        assert scenario.spec.topk == 1 and scenario.page_size == 16
        assert space.admits(node)
        for what, smaller in reductions(node):
            if smaller.get("page_size") != 16 or smaller.get("spec", {}).get("topk") != 1:
                assert not space.admits(smaller), what
    free = examples(space_for(cb, family="probes", mode="DECODE"), count=16, seed=0)
    assert {n["spec"]["topk"] for n, _ in free} != {1}  # without the pins the space draws others


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        (["spec.topkk=1"], "no key spec.topkk (did you mean 'spec.topk'?)"),
        (["pagesize=16"], "no key pagesize (did you mean 'page_size'?)"),
        (["topk"], "--where topk: give KEY=VALUE"),
        (["spec.topk=[1"], "not a YAML value"),
    ],
)
def test_a_bad_pin_is_one_line_naming_it(given, needle):
    from sglfix.search.space import parse_pins

    with pytest.raises(ConfigError, match=None) as err:
        parse_pins(given)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_prefixes_are_ones_the_engine_runs_each_mode_on():
    """A decode, a verify and a draft follow the prompt's prefill: the space never draws (nor the
    shrinker reaches) an empty prefix there, which the schema still takes for a kernel's layout
    case; an extend starts from nothing."""
    from sglfix.scenario.modes import rule_for

    cb = get_codebase("sglang-0.5.23")
    space = space_for(cb)
    drawn = examples(space, count=120, seed=1)
    lows = collections.Counter()
    for node, _ in drawn:
        low = rule_for(node["mode"]).engine_min_prefix
        assert min(node["batch"]["prefix_lens"]) >= low, node
        lows[low] += 1
        if low:
            empty = {**node, "batch": {**node["batch"], "prefix_lens": [0] * len(node["batch"]["prefix_lens"])}}
            assert not space.admits(empty)
    assert lows[0] and lows[1]
    assert rule_for("EXTEND").engine_min_prefix == 0 and rule_for("DRAFT_DECODE", "triton").engine_min_prefix == 1


def test_engine_flags_the_profile_names_are_drawn_one_at_a_time_and_a_wrong_one_is_refused():
    """Paths that run only under an engine flag (FlashInfer's host-side verify plan) are in the
    space where the profile's search_flags name the flag for the backend, and only there."""
    import dataclasses

    cb = get_codebase("sglang-0.5.23")
    drawn = [s for _, s in examples(space_for(cb, family="flashinfer"), count=80, seed=2)]
    flagged = collections.Counter(name for s in drawn for name in (s.env or {}))
    assert set(flagged) <= set(cb.search_flags["flashinfer"]) and len(flagged) >= 2, flagged
    assert all(len(s.env) == 1 and set(s.env.values()) == {"true"} for s in drawn if s.env)
    assert not any(s.env for _, s in examples(space_for(cb, family="triton"), count=40, seed=2))
    typo = dataclasses.replace(cb, search_flags={"flashinfer": ("SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLN",)})
    with pytest.raises(ConfigError) as err:
        space_for(typo, family="flashinfer")
    assert "search_flags.flashinfer" in str(err.value) and "SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN" in str(err.value)


def test_a_flag_that_makes_a_mode_sync_free_is_drawn_declared_so_for_cuda_and_nowhere_else():
    """A flag of ``sync_free_flags`` turned on in one of its modes: the scenario is declared
    sync-free on CUDA (only there can a mirror's read be told from a device read); the same flag in
    another mode, or another flag, declares nothing; a wrong entry is refused before any draw."""
    import dataclasses

    cb = get_codebase("sglang-0.5.23")
    declared = dict(cb.sync_free_flags["flashinfer"])
    drawn = [s for _, s in examples(space_for(cb, family="flashinfer"), count=160, seed=3)]
    flagged = [s for s in drawn if s.env]
    by_flag = [(next(iter(s.env)), s.mode, s.sync_free) for s in flagged]
    cuda = [(f, m) for f, m, sync in by_flag if sync == "cuda"]
    assert cuda and all(m in declared.get(f, ()) for f, m in cuda)
    assert all(sync == "cuda" for f, m, sync in by_flag if m in declared.get(f, ()))
    for bad, says in (
        ({"flashinfer": {"SGLANG_NOT_A_SEARCH_FLAG": ("DRAFT_DECODE",)}}, "not one of search_flags.flashinfer"),
        ({"flashinfer": {"SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR": ("DRAFT_DECOD",)}}, "runs no mode DRAFT_DECOD"),
    ):
        with pytest.raises(ConfigError) as err:
            space_for(dataclasses.replace(cb, sync_free_flags=bad), family="flashinfer")
        assert says in str(err.value) and "\n" not in str(err.value)
