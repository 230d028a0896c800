"""Scenario files: keys, grid expansion, limits, memory budget, errors with file:line, and a user's
own file running unchanged."""

from __future__ import annotations

import json
import time

import pytest
from clihelp import assert_one_line_error, run_cli

from sglfix.common.errors import ConfigError
from sglfix.scenario import (
    BACKENDS,
    MODE_RULES,
    MODES,
    Scenario,
    check_memory,
    estimate_memory,
    load_scenario_file,
    load_scenarios,
    memory_budget,
    parse_size,
    select_scenarios,
)
from sglfix.scenario.limits import MAX_GRID_POINTS, MAX_REQUESTS, MAX_SCENARIOS

USER_FILE = """\
name: my-verify-check
backend: triton
mode: TARGET_VERIFY
batch: {prefix_lens: [9, 30, 17]}
cuda_graph: {capture_bs: [4]}
gpu_only: true
page_size: 16
model: {num_heads: 8, num_kv_heads: 2, head_dim: 64, dtype: bfloat16}
spec: {topk: 1, num_steps: 2, num_draft_tokens: 3}
seed: 7
tolerance: 0.02
"""


def _load(tmp_path, text: str, name: str = "s.yaml", **kwargs):
    f = tmp_path / name
    f.write_text(text)
    return load_scenario_file(f, **kwargs)


def test_builtin_set_covers_every_dimension():
    scenarios = load_scenarios()
    # A diffusion LM's block extend runs on real sglang alone (profiles/sglang-0.5.23's scenarios).
    modes = set(MODES) - {"DLLM_EXTEND"}
    assert {s.mode for s in scenarios} == modes
    # Every backend the reproduction replays (torch_native and flashmla are real sglang's only).
    from sglfix.codebases import CODEBASES

    assert {s.backend for s in scenarios} == set(CODEBASES["reproduction"].adapters)
    assert set(CODEBASES["reproduction"].adapters) < set(BACKENDS)
    assert {s.page_size for s in scenarios} == {1, 16, 32, 64, 256}
    # The multi-step draft at topk 1, 4 and 8, and num_steps 2 to 5, on both FlashInfer families.
    for backend in ("flashinfer", "flashinfer_mla"):
        drafts = [s for s in scenarios if s.backend == backend and s.mode == "DRAFT_DECODE"]
        assert {s.spec.topk for s in drafts} == {1, 4, 8}
        assert {s.spec.num_steps for s in drafts} >= {2, 3, 5}
    # Draft extend on trtllm_mla with equal and unequal accept lengths.
    accepts = {len(set(s.accept_lens)) > 1 for s in scenarios if s.backend == "trtllm_mla"}
    assert accepts == {True, False}
    assert {s.model.dtype for s in scenarios} == {"float16", "bfloat16"}
    assert {s.gpu_only for s in scenarios} == {False, True}
    graphs = {(s.mode, s.cuda_graph, s.padded) for s in scenarios}
    for mode in modes - {"EXTEND"}:
        assert {(mode, False, False), (mode, True, False), (mode, True, True)} <= graphs
    assert {s.builder for s in scenarios if s.mode == "DRAFT_EXTEND_V2"} == {"kit", "glue"}
    assert len({s.name for s in scenarios}) == len(scenarios)
    groups = {s.model.num_heads // s.model.num_kv_heads for s in scenarios}
    assert 4 in groups, "GQA with 4 query heads per KV head"
    assert any(s.model.num_kv_heads == 1 and s.model.num_heads > 1 for s in scenarios), "MQA"
    zero = {s.mode for s in scenarios if 0 in s.prefix_lens}
    assert "EXTEND" in zero and zero & {"TARGET_VERIFY", "DRAFT_EXTEND", "DRAFT_EXTEND_V2"}, zero
    assert "DECODE" in zero, "a first token attending only itself"
    assert any(s.batch_size >= 64 for s in scenarios)
    # Sequences ending exactly on a page edge and crossing one by a single token, at page sizes > 1.
    ends = [(p + e) % s.page_size for s in scenarios if s.page_size > 1 for p, e in zip(s.prefix_lens, s.extend_lens)]
    assert 0 in ends and 1 in ends


def test_grid_names_and_values(tmp_path):
    got = {
        s.name: s
        for s in _load(
            tmp_path,
            "name: g\nmode: DECODE\nbatch: {prefix_lens: [5, 6]}\n"
            "grid:\n  model.dtype: [float16, bfloat16]\n  cuda_graph: [false, {capture_bs: [4]}]\n",
        )
    }
    assert set(got) == {
        "g@dtype=fp16,cg=eager",
        "g@dtype=fp16,cg=graph-padded",
        "g@dtype=bf16,cg=eager",
        "g@dtype=bf16,cg=graph-padded",
    }
    s = got["g@dtype=bf16,cg=graph-padded"]
    assert s.model.dtype == "bfloat16" and s.capture_bs == (4,) and s.graph_bs == 4 and s.padded


def test_an_encoder_decoder_batch_is_read_and_counted(tmp_path):
    """batch.encoder_lens and model.cross_attention (gridable: one scenario, self and cross cells);
    the encoder tokens count in the context and the memory estimate."""
    head = "name: ed\nbackend: flashinfer\nmode: DECODE\nbatch: {prefix_lens: [5, 6], encoder_lens: [%s]}\n"
    got = {s.name: s for s in _load(tmp_path, head % "7, 30" + "grid: {model.cross_attention: [false, true]}\n")}
    assert set(got) == {"ed@cross=off", "ed@cross=on"}
    assert got["ed@cross=on"].model.cross_attention and not got["ed@cross=off"].model.cross_attention
    assert got["ed@cross=on"].encoder_lens == (7, 30)
    assert Scenario.from_json(json.loads(json.dumps(got["ed@cross=on"].to_json()))) == got["ed@cross=on"]
    (plain,) = _load(tmp_path, head.replace(", encoder_lens: [%s]", ""))
    assert plain.encoder_lens is None and not plain.model.cross_attention
    pool = "KV pool (2x scattered pages)"
    assert estimate_memory(got["ed@cross=off"]).parts[pool] > estimate_memory(plain).parts[pool]
    # max_context_len holds the encoder tokens too (request 1: 30 + 6 + 1).
    with pytest.raises(ConfigError, match=r"request 1 needs 37 positions \(encoder 30 \+ prefix 6 \+ new 1\)"):
        _load(tmp_path, head % "7, 30" + "max_context_len: 36\n")
    assert _load(tmp_path, head % "7, 30" + "max_context_len: 37\n")


ENCODER_DECODER_BAD = [
    ("prefix_lens: [5, 6], encoder_lens: [7]", "", "has 1 batch.encoder_lens for 2 requests"),
    ("prefix_lens: [5, 6], encoder_lens: [7, 0]", "", ">= 1"),
    ("prefix_lens: [5, 6]", "model: {cross_attention: true}", "model.cross_attention (an encoder-decoder"),
    (
        "prefix_lens: [5, 6], encoder_lens: [7, 8]",
        "model: {sliding_window: 4}",
        "sets batch.encoder_lens and model.sliding_window",
    ),
    ("prefix_lens: [5, 6], encoder_lens: [7, 8]", "model: {cross_attention: 1}", "must be true or false"),
]


@pytest.mark.parametrize("batch,extra,needle", ENCODER_DECODER_BAD, ids=[b[2][:24] for b in ENCODER_DECODER_BAD])
def test_an_encoder_decoder_batch_is_refused_at_load_where_it_cannot_run(tmp_path, batch, extra, needle):
    msg = _refused(tmp_path, f"name: x\nbackend: flashinfer\nmode: DECODE\nbatch: {{{batch}}}\n{extra}\n")
    assert needle in msg and "\n" not in msg, msg


def _refused(tmp_path, text: str) -> str:
    """The one-line error loading ``text`` as a scenario file raises."""
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_scenario_file(f)
    return str(info.value)


@pytest.mark.parametrize(
    "backend,mode",
    [("triton", "DECODE"), ("flashinfer", "TARGET_VERIFY"), ("flashinfer", "DRAFT_EXTEND_V2")],
)
def test_an_encoder_decoder_batch_runs_on_flashinfer_in_decode_and_extend_only(tmp_path, backend, mode):
    f = tmp_path / "bad.yaml"
    f.write_text(f"name: x\nbackend: {backend}\nmode: {mode}\nbatch:\n  prefix_lens: [5]\n  encoder_lens: [7]\n")
    with pytest.raises(ConfigError) as info:
        load_scenario_file(f)
    msg = str(info.value)
    assert "bad.yaml:6:" in msg, msg
    assert f"sets batch.encoder_lens with backend {backend} in mode {mode}; an encoder-decoder batch runs on " in msg
    assert "flashinfer in DECODE, EXTEND" in msg, msg


def test_a_multi_item_batch_is_read_round_trips_and_takes_items_of_any_length(tmp_path):
    """batch.items: per request its item lengths (an empty list: the query and one delimiter; an
    item of 0 tokens; null: a request without delimiters), the query what is left of extend_lens."""
    text = (
        "name: mis\nbackend: flashinfer\nmode: EXTEND\n"
        "batch: {prefix_lens: [0, 5, 2, 0], extend_lens: [9, 3, 2, 4], items: [[2, 1], [0], [], null]}\n"
    )
    (got,) = _load(tmp_path, text)
    assert got.items == ((2, 1), (0,), (), None) and got.extend_lens == (9, 3, 2, 4)
    assert Scenario.from_json(json.loads(json.dumps(got.to_json()))) == got
    (plain,) = _load(tmp_path, text.replace(", items: [[2, 1], [0], [], null]", ""))
    assert plain.items is None


MULTI_ITEM_BAD = [
    ("extend_lens: [9, 4], items: [[2, 1]]", "", "has 1 batch.items entries for 2 requests"),
    (
        "extend_lens: [9, 4], items: [[2, 1], [1, 1]]",
        "",
        "has batch.items[1] = [1, 1]: 2 item tokens and 3 delimiters need 6 new tokens with a query of one, "
        "request 1 has 4; raise batch.extend_lens[1] or shorten its items",
    ),
    ("extend_lens: [9, 4], items: [[2, -1], [1]]", "", "must be >= 0, got -1"),
    (
        "extend_lens: [9, 4], items: [3, [1]]",
        "",
        "must be a list of item lengths (or null for a request without items)",
    ),
    ("extend_lens: [9, 4], items: [[2, 1], [1]]", "cuda_graph: {capture_bs: [2]}", "sets batch.items and cuda_graph"),
    (
        "extend_lens: [9, 4], items: [[2, 1], [1]], encoder_lens: [3, 3]",
        "",
        "sets batch.items and batch.encoder_lens",
    ),
    (
        "extend_lens: [9, 4], items: [[2, 1], [1]]",
        "model: {sliding_window: 8}",
        "sets batch.items and model.sliding_window",
    ),
    ("extend_lens: [9, 4], items: [[2, 1], [1]]", "gpu_only: true", "gpu_only applies to"),
]


@pytest.mark.parametrize("batch,extra,needle", MULTI_ITEM_BAD, ids=[b[2][:28] for b in MULTI_ITEM_BAD])
def test_a_multi_item_batch_is_refused_at_load_where_it_cannot_run(tmp_path, batch, extra, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(f"name: x\nbackend: flashinfer\nmode: EXTEND\nbatch: {{prefix_lens: [0, 5], {batch}}}\n{extra}\n")
    with pytest.raises(ConfigError) as info:
        load_scenario_file(f)
    msg = str(info.value)
    assert needle in msg and "\n" not in msg, msg


@pytest.mark.parametrize(
    "backend,mode,extend",
    [
        ("triton", "EXTEND", "extend_lens: [9]"),
        ("flashinfer", "DECODE", ""),
        ("flashinfer", "TARGET_VERIFY", ""),
        ("flashinfer_mla", "EXTEND", "extend_lens: [9]\nmodel: {num_heads: 16}"),
    ],
)
def test_a_multi_item_batch_runs_on_flashinfer_in_extend_only(tmp_path, backend, mode, extend):
    f = tmp_path / "bad.yaml"
    f.write_text(f"name: x\nbackend: {backend}\nmode: {mode}\nbatch:\n  prefix_lens: [5]\n  items: [[2]]\n  {extend}\n")
    with pytest.raises(ConfigError) as info:
        load_scenario_file(f)
    msg = str(info.value)
    assert "bad.yaml:6:" in msg, msg
    assert f"sets batch.items with backend {backend} in mode {mode}; a multi-item scoring batch runs on " in msg
    assert "flashinfer in EXTEND; hybrid_linear in EXTEND only" in msg, msg


HYBRID_ITEMS_BAD = [
    ("prefix_lens: [0, 5], extend_lens: [9, 4], items: [[2, 1], [1]]", "", "has batch.prefix_lens[1] = 5 for a"),
    ("prefix_lens: [0, 0], extend_lens: [9, 4], items: [[2, 1], []]", "", "has batch.items[1] = []; GDN's"),
    ("prefix_lens: [0, 0], extend_lens: [9, 4], items: [[2, 1], null]", "", "has batch.items[1] = null beside scored"),
    (
        "prefix_lens: [0, 0], extend_lens: [9, 4], items: [[2, 1], [1]]",
        "page_size: 16",
        "sets batch.items with page_size 16; a hybrid model scores items over FlashInfer",
    ),
    (
        "prefix_lens: [0, 0], extend_lens: [9, 4], items: [[2, 1], [1]]",
        "model: {linear_attention: mamba2}",
        "sets batch.items with model.linear_attention mamba2; only the gated delta net",
    ),
    (
        "prefix_lens: [0, 0], extend_lens: [9, 4], items: [[2, 1], [1]]",
        "model: {head_dim: 32}",
        "sets batch.items with model.head_dim 32",
    ),
]


@pytest.mark.parametrize("batch,extra,needle", HYBRID_ITEMS_BAD, ids=[b[2][:30] for b in HYBRID_ITEMS_BAD])
def test_a_hybrid_scores_items_only_as_sglang_does_gdn_over_flashinfer_without_prefixes(tmp_path, batch, extra, needle):
    msg = _refused(tmp_path, f"name: x\nbackend: hybrid_linear\nmode: EXTEND\nbatch: {{{batch}}}\n{extra}\n")
    assert needle in msg and "\n" not in msg, msg
    text = "name: x\nbackend: hybrid_linear\nmode: EXTEND\nbatch: {prefix_lens: [0, 0], extend_lens: [9, 4], "
    (ok,) = _load(tmp_path, text + "items: [[2, 1], [1]]}\n", name="ok.yaml")
    assert ok.items == ((2, 1), (1,))
    (generate,) = _load(tmp_path, text + "items: [null, null]}\n", name="generate.yaml")  # no request scores
    assert generate.items == (None, None)


# A plain EXTEND as sglang's full prefill graph (flashinfer only): capture_bs its token buckets.
PREFILL_GRAPH = (
    "name: pg\nbackend: {backend}\nmode: EXTEND\nbatch: {{prefix_lens: [13, 0, 37], extend_lens: [5, 7, 9]{extra}}}\n"
    "{model}cuda_graph: {graph}\n"
)


def _prefill_graph(backend="flashinfer", graph="{capture_bs: [21], full_prefill_max_req: 3}", extra="", model=""):
    return PREFILL_GRAPH.format(backend=backend, graph=graph, extra=extra, model=model)


def test_an_extend_graph_takes_token_buckets_and_request_slots(tmp_path):
    """On flashinfer an EXTEND is captured as sglang's prefill runner captures it: one graph per
    token bucket (capture_bs), each over full_prefill_max_req request slots; padded where the
    tokens or the requests fall short of them."""
    text = (
        "name: pg\nbackend: flashinfer\nmode: EXTEND\nbatch: {prefix_lens: [13, 0, 37], extend_lens: [5, 7, 9]}\n"
        "grid:\n  cuda_graph: [false, {capture_bs: [21], full_prefill_max_req: 3},"
        " {capture_bs: [16, 32], full_prefill_max_req: 4}]\n  seed: [1, 2]\n"
    )
    got = {s.name: s for s in _load(tmp_path, text)}
    shapes = {name: (s.graph_tokens, s.graph_bs, s.padded) for name, s in got.items() if name.endswith("seed=1")}
    assert shapes == {
        "pg@cg=eager,seed=1": (None, None, False),
        "pg@cg=graph,seed=1": (21, 3, False),
        "pg@cg=graph-padded,seed=1": (32, 4, True),
    }, shapes
    for s in got.values():
        assert Scenario.from_json(json.loads(json.dumps(s.to_json()))) == s
    padded = got["pg@cg=graph-padded,seed=2"]
    assert padded.capture_bs == (16, 32) and padded.full_prefill_max_req == 4
    # The requests alone padded: a bucket of the tokens, one slot more than the requests.
    (slots,) = _load(tmp_path, _prefill_graph(graph="{capture_bs: [21], full_prefill_max_req: 4}"))
    assert (slots.graph_tokens, slots.graph_bs, slots.padded) == (21, 4, True)
    # The estimate counts the prefill runner's buffers and the full-graph wrappers' workspace.
    assert "CUDA-graph static buffers" in estimate_memory(padded).parts


PREFILL_GRAPH_BAD = [
    ({"backend": "triton"}, "is EXTEND, which is not captured in CUDA graphs; set cuda_graph: false"),
    ({"backend": "torch_native"}, "is EXTEND, which is not captured in CUDA graphs; set cuda_graph: false"),
    (
        {"backend": "hybrid_linear"},
        "is an EXTEND graph of the hybrid backend, which sglang captures under breakable prefill graphs only",
    ),
    (
        {"graph": "{capture_bs: [21], breakable: true}"},
        "sets cuda_graph.breakable, which sglfix models where the backend keeps the tables it captured",
    ),
    (
        {"backend": "hybrid_linear", "graph": "{capture_bs: [21], breakable: true}"},
        "sets cuda_graph.breakable, which sglfix models where the backend keeps the tables it captured",
    ),
    (
        {
            "backend": "hybrid_linear",
            "graph": "{capture_bs: [21], breakable: true, full_prefill_max_req: 3}",
            "model": "model: {linear_attention: kda}\n",
        },
        "sets cuda_graph.full_prefill_max_req with cuda_graph.breakable",
    ),
    (
        {
            "backend": "hybrid_linear",
            "graph": "{capture_bs: [64], breakable: true}",
            "model": "model: {linear_attention: kda}\n",
        },
        "pads its 21 new tokens to the bucket 64, more than 2x: sglang runs it eagerly",
    ),
    (
        {"backend": "flashinfer_mla", "model": "model: {num_heads: 16}\n"},
        "is EXTEND, which is not captured in CUDA graphs; set cuda_graph: false",
    ),
    ({"graph": "{capture_bs: [21]}"}, "needs the request slots each graph is captured with"),
    (
        {"graph": "{capture_bs: [21], full_prefill_max_req: 2}"},
        "has a batch of 3 requests, more than cuda_graph.full_prefill_max_req 2: sglang runs it eagerly",
    ),
    ({"graph": "{capture_bs: [16], full_prefill_max_req: 3}"}, "has 21 new tokens, which fit no captured token"),
    (
        {"graph": "{capture_bs: [43], full_prefill_max_req: 3}"},
        "pads its 21 new tokens to the bucket 43, more than 2x: sglang runs it eagerly",
    ),
    ({"extra": ", encoder_lens: [3, 3, 3]"}, "sets batch.encoder_lens in an EXTEND graph"),
    ({"model": "model: {sliding_window: 8}\n"}, "sets model.sliding_window in an EXTEND graph"),
]


@pytest.mark.parametrize(
    "parts,needle", PREFILL_GRAPH_BAD, ids=[f"{i}-{b[1][:24]}" for i, b in enumerate(PREFILL_GRAPH_BAD)]
)
def test_an_extend_graph_is_refused_where_sglang_would_not_replay_it(tmp_path, parts, needle):
    """Every backend but flashinfer refuses an EXTEND graph in one line; on flashinfer, a batch the
    prefill runner would run eagerly, or a layer it does not capture."""
    f = tmp_path / "bad.yaml"
    f.write_text(_prefill_graph(**parts))
    with pytest.raises(ConfigError) as info:
        load_scenario_file(f)
    msg = str(info.value)
    assert needle in msg and "\n" not in msg and "bad.yaml:" in msg, msg


def test_a_breakable_prefill_graph_has_no_request_slots(tmp_path):
    """A Kimi-Linear hybrid's breakable prefill graph: token buckets, the batch's own requests."""
    (graph,) = _load(
        tmp_path,
        _prefill_graph(
            backend="hybrid_linear",
            graph="{capture_bs: [16, 32], breakable: true}",
            model="model: {linear_attention: kda}\n",
        ),
    )
    assert (graph.graph_tokens, graph.graph_bs, graph.padded, graph.breakable_prefill) == (32, 3, True, True)
    assert Scenario.from_json(json.loads(json.dumps(graph.to_json()))) == graph


@pytest.mark.parametrize(
    "head, graph",
    [
        ("backend: hybrid_linear\nmodel: {linear_attention: kda}\n", "breakable: true"),
        ("backend: flashinfer\n", "full_prefill_max_req: 2"),
    ],
    ids=["breakable", "full_prefill_max_req"],
)
def test_a_prefill_graph_key_is_an_extend_graphs_alone(tmp_path, head, graph):
    msg = _refused(
        tmp_path,
        f"name: x\n{head}mode: DECODE\nbatch: {{prefix_lens: [3]}}\ncuda_graph: {{capture_bs: [2], {graph}}}\n",
    )
    key = graph.split(":")[0]
    assert f"is DECODE; cuda_graph.{key} applies to an EXTEND graph" in msg and "\n" not in msg, msg


CPU_GRAPH_BAD = [
    ("backend: triton\nmode: DECODE\n", "", "sets cuda_graph.cpu with backend triton in mode DECODE"),
    ("backend: hybrid_linear\nmode: TARGET_VERIFY\n", "", "sets cuda_graph.cpu with backend hybrid_linear in mode"),
    (
        "backend: hybrid_linear\nmode: DECODE\n",
        ", mamba_track: [1, 0, 0]",
        "sets batch.mamba_track with cuda_graph.cpu",
    ),
]


@pytest.mark.parametrize("head, extra, needle", CPU_GRAPH_BAD, ids=["triton", "verify", "track"])
def test_a_cpu_graph_is_a_hybrid_decode_alone(tmp_path, head, extra, needle):
    """sglang's CPU graph runner captures decode only; sglfix models it over the hybrid's CPU
    attention backend, for a plain decode."""
    msg = _refused(
        tmp_path,
        f"name: x\n{head}batch: {{prefix_lens: [13, 0, 37]{extra}}}\ncuda_graph: {{capture_bs: [4], cpu: true}}\n",
    )
    assert needle in msg and "\n" not in msg and "bad.yaml:" in msg, msg


BAD = [
    ("name: x\nmode: DECOD\nbatch: {prefix_lens: [3]}\n", 2, "did you mean 'DECODE'"),
    ("name: x\nmode: DECODE\nbatch: {prefix_len: [3]}\n", 3, "unknown key 'prefix_len'"),
    ("name: x\nmode: DECODE\nbatch: {prefix_lens: [-1]}\n", 3, ">= 0"),
    (
        "name: x\nmode: DECODE\nbatch: {prefix_lens: [3, 4]}\ncuda_graph: {capture_bs: [1]}\n",
        4,
        "fits no captured size",
    ),
    ("name: x\nmode: EXTEND\nbatch: {prefix_lens: [3]}\n", 3, "needs batch.extend_lens"),
    ("name: x\nmode: DRAFT_EXTEND\nbatch: {prefix_lens: [3]}\n", 3, "needs batch.accept_lens"),
    (
        "name: x\nmode: DECODE\nbatch: {prefix_lens: [3]}\nmodel: {num_heads: 3, num_kv_heads: 2}\n",
        4,
        "multiple of num_kv_heads",
    ),
    ("name: x\nmode: DECODE\nbatch: {prefix_lens: [3]}\ngrid: {pagesize: [1]}\n", 4, "not a scenario key"),
    ("name: x\nmode: DECODE\nbatch: {prefix_lens: [3]}\ntolerance: 2\n", 4, "tolerance"),
    ("name: x\nmode: DRAFT_EXTEND\nbatch: {prefix_lens: [3], accept_lens: [4]}\n", 3, "< spec.num_draft_tokens"),
    # The mode table: which modes take which keys, graphs, gpu_only, topk, builders.
    (
        "name: x\nmode: TARGET_VERIFY\nbatch: {prefix_lens: [3], accept_lens: [1]}\n",
        3,
        "the commit after a verify runs on hybrid_linear only",
    ),
    ("name: x\nmode: DECODE\nbatch: {prefix_lens: [3], accept_lens: [1]}\n", 3, "takes no batch.accept_lens"),
    (
        "name: x\nbackend: hybrid_linear\nmode: TARGET_VERIFY\nbatch: {prefix_lens: [3], accept_lens: [4]}\n"
        "spec: {num_steps: 3, num_draft_tokens: 4}\n",
        4,
        "a verify of 4 draft tokens (topk 1, 3 steps) accepts at most 3",
    ),
    (
        "name: x\nbackend: hybrid_linear\nmode: TARGET_VERIFY\nbatch: {prefix_lens: [3], accept_lens: [3]}\n"
        "spec: {topk: 2, num_steps: 2, num_draft_tokens: 5}\n",
        4,
        "(topk 2, 2 steps) accepts at most 2",
    ),
    ("name: x\nmode: DECODE\nbatch:\n  prefix_lens: [3]\n  extend_lens: 2\n", 5, "contradicts mode DECODE"),
    (
        "name: x\nmode: EXTEND\nbatch: {prefix_lens: [3], extend_lens: 1}\ncuda_graph: {capture_bs: [1]}\n",
        4,
        "not captured in CUDA graphs",
    ),
    ("name: x\nmode: EXTEND\nbatch: {prefix_lens: [3], extend_lens: 1}\ngpu_only: true\n", 4, "gpu_only applies to"),
    (
        "name: x\nmode: DRAFT_EXTEND\nbatch: {prefix_lens: [3], accept_lens: [2]}\nspec:\n  topk: 2\n",
        5,
        "spec.topk 1 only",
    ),
    ("name: x\nmode: DECODE\nbatch: {prefix_lens: [3]}\nbuilder: glue\n", 4, "applies to DRAFT_EXTEND_V2 only"),
    (
        "name: x\nmode: DRAFT_EXTEND\nbatch: {prefix_lens: [3], accept_lens: [4]}\nspec: {num_steps: 3, num_draft_tokens: 8}\n",
        3,
        "<= spec.num_steps (3)",
    ),
    (
        "name: x\nmode: TARGET_VERIFY\nbatch: {prefix_lens: [3]}\nspec:\n  num_steps: 2\n  num_draft_tokens: 5\n",
        6,
        "does not fit a draft tree",
    ),
    # Decode context parallelism: where a backend builds every rank's metadata, in its modes.
    ("name: x\nbackend: flashinfer\nmode: DECODE\nbatch: {prefix_lens: [3]}\ndcp_size: 2\n", 5, "dcp_size applies to"),
    (
        "name: x\nmode: TARGET_VERIFY\nbatch: {prefix_lens: [3]}\ndcp_size: 2\n",
        4,
        "decode context parallelism runs on triton in DECODE, EXTEND",
    ),
    (
        "name: x\nmode: EXTEND\nbatch: {prefix_lens: [3], extend_lens: 1}\ndcp_size: 2\nmodel: {sliding_window: 4}\n",
        4,
        "sets dcp_size 2 and model.sliding_window",
    ),
    (
        "name: x\nbackend: hybrid_linear\nmode: DECODE\nbatch: {prefix_lens: [3]}\nmodel: {ple_states: true}\n",
        5,
        "the side states are rolled forward by the commit after a verify only",
    ),
    # A diffusion LM's block extend: one canvas width, no window.
    ("name: x\nmode: DLLM_EXTEND\nbatch: {prefix_lens: [3, 4], extend_lens: [4, 8]}\n", 3, "give one integer"),
    (
        "name: x\nmode: DLLM_EXTEND\nbatch: {prefix_lens: [3], extend_lens: 4}\ndeterministic: true\n",
        4,
        "is DLLM_EXTEND and sets deterministic",
    ),
    (
        "name: x\nbackend: hybrid_linear\nmode: EXTEND\nbatch: {prefix_lens: [0], extend_lens: 3}\n"
        "model: {replayssm_ring: 4}\n",
        5,
        "ReplaySSM is the decode ring",
    ),
    # Names: printed and matched by glob; whitespace and control characters are refused.
    ("name: my scenario\nmode: DECODE\nbatch: {prefix_lens: [3]}\n", 1, "without spaces"),
    ('name: "a\\tb"\nmode: DECODE\nbatch: {prefix_lens: [3]}\n', 1, "control characters"),
    # A value substituted by grid: the error cites the grid's line for that value.
    ("name: x\nmode: DECODE\nbatch: {prefix_lens: [3]}\ngrid:\n  page_size:\n    - 16\n    - 0\n", 7, ">= 1"),
    (
        "name: x\nmode: DECODE\nbatch: {prefix_lens: [3]}\ngrid: {model.dtyp: [float16]}\n",
        4,
        "did you mean 'model.dtype'",
    ),
]


@pytest.mark.parametrize("text,line,needle", BAD, ids=[b[2][:24] for b in BAD])
def test_bad_scenarios_cite_file_and_line(tmp_path, text, line, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_scenario_file(f)
    msg = str(info.value)
    assert f"bad.yaml:{line}:" in msg and needle in msg and "\n" not in msg, msg


# ------------------------------------------------------------------ valid input once refused


@pytest.mark.parametrize(
    "mode,extra",
    [
        ("EXTEND", "extend_lens: [5, 9]"),
        ("DECODE", ""),
        ("TARGET_VERIFY", ""),
        ("DRAFT_EXTEND", "accept_lens: [1, 3]"),
        ("DRAFT_EXTEND_V2", ""),
    ],
)
def test_zero_prefix_is_accepted_in_every_mode(tmp_path, mode, extra):
    batch = "{prefix_lens: [0, 12]" + (f", {extra}" if extra else "") + "}"
    graph = "" if mode == "EXTEND" else "cuda_graph: {capture_bs: [4]}\n"
    (s,) = _load(tmp_path, f"name: z\nmode: {mode}\nbatch: {batch}\n{graph}")
    assert s.prefix_lens == (0, 12)


def test_mode_and_dtype_in_any_case_are_normalised(tmp_path):
    (s,) = _load(
        tmp_path,
        "name: c\nmode: target_verify\nbackend: Triton\nbuilder: KIT\n"
        "batch: {prefix_lens: [3]}\nmodel: {dtype: BFloat16}\n",
    )
    assert (s.mode, s.backend, s.builder, s.model.dtype) == ("TARGET_VERIFY", "triton", "kit", "bfloat16")
    (d,) = _load(tmp_path, "name: d\nmode: Draft-Extend-V2\nbatch: {prefix_lens: [3]}\nmodel: {dtype: FP16}\n")
    assert (d.mode, d.model.dtype, d.tolerance) == ("DRAFT_EXTEND_V2", "float16", 1e-2)


def test_batches_up_to_the_request_limit_are_accepted(tmp_path):
    prefix = ", ".join(str(i % 5) for i in range(MAX_REQUESTS))
    (s,) = _load(
        tmp_path,
        f"name: big\nmode: DECODE\nbatch: {{prefix_lens: [{prefix}]}}\ncuda_graph: {{capture_bs: [{MAX_REQUESTS}]}}\n",
    )
    assert s.batch_size == MAX_REQUESTS >= 256 and s.graph_bs == MAX_REQUESTS


def test_the_kit_sizes_its_request_pool_for_large_batches_and_graphs():
    """Once a fixed req_pool_size=32: 32 requests or more (or a graph that large) crashed."""
    from sglfix.backends.srt.model_executor.cuda_graph_runner import make_runner_for_case
    from sglfix.backends.test.kits.attention_unittest.attention_methods.dense_attention import build_case

    case = build_case(
        mode="decode", prefix_lens=[i % 3 for i in range(256)], num_heads=1, num_kv_heads=1, head_dim=16, device="cpu"
    )
    assert case.batch_size == 256 and case.model_runner.req_to_token_pool.size > 256
    small = build_case(mode="decode", prefix_lens=[0, 5], capture_bs=[2, 64], device="cpu")
    runner = make_runner_for_case(small, backend=small.make_backend(), capture_bs=[2, 64], capture=False)
    assert runner.padded_bs(2) == 2 and runner.max_bs == 64


# ------------------------------------------------------------------ nonsense refused at load

NONSENSE = [
    ("prefix_lens", "batch: {prefix_lens: [1000000000000]}", 3, "over the limit of 131072 tokens per request"),
    ("prefix_lens-text", "batch: {prefix_lens: [1e12]}", 3, "write the digits"),
    ("head_dim", "batch: {prefix_lens: [3]}\nmodel: {head_dim: 1048576}", 4, "over the limit of 512"),
    ("head_dim-odd", "batch: {prefix_lens: [3]}\nmodel: {head_dim: 96}", 4, "power of two"),
    (
        "num_heads",
        "batch: {prefix_lens: [3]}\nmodel: {num_heads: 100000, num_kv_heads: 1}",
        4,
        "over the limit of 256 heads",
    ),
    ("page_size", "batch: {prefix_lens: [3]}\npage_size: 1048576", 4, "over the limit of 1024 tokens per page"),
    ("num_steps", "batch: {prefix_lens: [3]}\nspec: {num_steps: 1000000000}", 4, "over the limit of 32 steps"),
    ("topk", "batch: {prefix_lens: [3]}\nspec: {topk: 1000}", 4, "over the limit of 16"),
    (
        "num_draft_tokens",
        "batch: {prefix_lens: [3]}\nspec: {num_draft_tokens: 100000}",
        4,
        "over the limit of 256 draft tokens",
    ),
    (
        "capture_bs",
        "batch: {prefix_lens: [3]}\ncuda_graph: {capture_bs: [100000]}",
        4,
        "over the limit of 1024 requests",
    ),
    (
        "capture_sizes",
        "batch: {prefix_lens: [3]}\ncuda_graph: {capture_bs: [" + ", ".join(map(str, range(1, 100))) + "]}",
        4,
        "over the limit of 64",
    ),
    ("requests", "batch: {prefix_lens: [" + ", ".join(["1"] * 2000) + "]}", 3, "over the limit of 1024 requests"),
    ("tokens-per-request", "batch: {prefix_lens: [131072]}", 3, "131073 tokens"),
    ("tokens-per-batch", "batch: {prefix_lens: [" + ", ".join(["100000"] * 11) + "]}", 3, "tokens per batch"),
    ("seed", "batch: {prefix_lens: [3]}\nseed: 99999999999999999999999", 4, "over the limit"),
    ("float", "batch: {prefix_lens: [3.0]}", 3, "must be an integer"),
    ("bool", "batch: {prefix_lens: [true]}", 3, "must be an integer"),
]


@pytest.mark.parametrize("body,line,needle", [n[1:] for n in NONSENSE], ids=[n[0] for n in NONSENSE])
def test_sizes_over_their_limit_are_refused_at_load(tmp_path, body, line, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(f"name: x\nmode: DECODE\n{body}\n")
    with pytest.raises(ConfigError) as info:
        load_scenario_file(f)
    msg = str(info.value)
    assert f"bad.yaml:{line}:" in msg and needle in msg and "\n" not in msg, msg


def test_a_million_point_grid_is_refused_before_expanding(tmp_path):
    values = "[" + ", ".join(str(i) for i in range(100)) + "]"
    text = (
        "name: g\nmode: DECODE\nbatch: {prefix_lens: [3]}\ngrid:\n"
        f"  seed: {values}\n  page_size: {values}\n  model.num_heads: {values}\n"
    )
    t0 = time.monotonic()
    with pytest.raises(
        ConfigError,
        match=rf"s.yaml:4: grid expands to 1000000 scenarios \(100 x 100 x 100\), "
        rf"over the limit of {MAX_GRID_POINTS}",
    ):
        _load(tmp_path, text)
    assert time.monotonic() - t0 < 2


def test_too_many_scenarios_in_one_file_are_refused(tmp_path):
    seeds = "[" + ", ".join(str(i) for i in range(MAX_GRID_POINTS)) + "]"
    items = "".join(
        f"  - {{name: s{i}, mode: DECODE, batch: {{prefix_lens: [3]}}, grid: {{seed: {seeds}}}}}\n"
        for i in range(MAX_SCENARIOS // MAX_GRID_POINTS + 1)
    )
    with pytest.raises(ConfigError, match=f"expands to {MAX_SCENARIOS + MAX_GRID_POINTS} scenarios, over the limit"):
        _load(tmp_path, "scenarios:\n" + items)


def test_oversized_and_empty_files_are_refused(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (2 * 1024 * 1024) + "\n")
    with pytest.raises(ConfigError, match=r"big\.yaml is .* bytes"):
        load_scenario_file(big)
    with pytest.raises(ConfigError, match="is empty"):
        _load(tmp_path, "# nothing\n", name="empty.yaml")


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path):
    """Ten levels of ten aliases: 10^10 integers if anything walked or printed the whole value."""
    anchors = "".join(f"  - &a{i} [" + ", ".join([f"*a{i - 1}" if i else "1"] * 10) + "]\n" for i in range(10))
    f = tmp_path / "bomb.yaml"
    f.write_text("anchors:\n" + anchors + "name: b\nmode: DECODE\nbatch: {prefix_lens: *a9}\ngrid: {seed: *a9}\n")
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_scenario_file(f)
    assert time.monotonic() - t0 < 5 and len(str(info.value)) < 400, str(info.value)[:400]


# ------------------------------------------------------------------ memory budget

HEAVY = "name: heavy\nmode: EXTEND\nbatch: {prefix_lens: [8192, 8192], extend_lens: 8192}\nmodel: {num_heads: 32, num_kv_heads: 8, head_dim: 128}\n"


def test_memory_estimate_over_the_budget_is_refused_naming_scenario_and_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("SGLFIX_MEMORY_BUDGET", raising=False)
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, HEAVY)
    msg = str(info.value)
    assert msg.startswith(f"{tmp_path / 's.yaml'}:1: scenario heavy needs about ") and "reference" in msg, msg
    assert "over the memory budget of 8.0 GiB" in msg and "SGLFIX_MEMORY_BUDGET=" in msg, msg
    (s,) = _load(tmp_path, HEAVY, memory_budget=parse_size("1T", what="budget"))
    assert estimate_memory(s).total > 8 * 1024**3
    monkeypatch.setenv("SGLFIX_MEMORY_BUDGET", "1T")
    assert _load(tmp_path, HEAVY) and memory_budget() == 1024**4


def test_the_estimate_counts_the_kv_pool_page_size_and_graph_buffers(tmp_path):
    small, paged = _load(
        tmp_path, "name: p\nmode: DECODE\nbatch: {prefix_lens: [3, 40]}\ngrid: {page_size: [1, 1024]}\n"
    )
    pool = "KV pool (2x scattered pages)"
    assert estimate_memory(paged).parts[pool] > 100 * estimate_memory(small).parts[pool]
    (graph,) = _load(
        tmp_path, "name: g\nmode: TARGET_VERIFY\nbatch: {prefix_lens: [3]}\ncuda_graph: {capture_bs: [1, 512]}\n"
    )
    assert estimate_memory(graph).parts["CUDA-graph static buffers"] > 0
    builtin = load_scenarios()
    check_memory(builtin, budget_bytes=512 * 1024**2)  # the built-in set is small
    with pytest.raises(ConfigError, match=r"scenario .* needs about .* over the memory budget of 1.0 KiB"):
        check_memory(builtin, budget_bytes=1024)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("17179869184", 16 * 1024**3),
        ("16G", 16 * 1024**3),
        ("16GiB", 16 * 1024**3),
        ("512m", 512 * 1024**2),
        ("1.5T", 3 * 1024**4 // 2),
    ],
)
def test_memory_budget_sizes(text, expected):
    assert memory_budget({"SGLFIX_MEMORY_BUDGET": text}) == expected


@pytest.mark.parametrize("text", ["lots", "0", "-5G", "16Q"])
def test_a_bad_memory_budget_is_a_one_line_error(text):
    with pytest.raises(ConfigError, match="SGLFIX_MEMORY_BUDGET"):
        memory_budget({"SGLFIX_MEMORY_BUDGET": text})


# ------------------------------------------------------------------ the public surface


def test_json_round_trip_is_exact():
    for s in load_scenarios():
        data = json.loads(json.dumps(s.to_json()))
        back = Scenario.from_json(data)
        assert back == s and back.to_json() == data
    with pytest.raises(ConfigError, match=r"extend_lens has 1 items for \d+ requests"):
        Scenario.from_json({**load_scenarios()[0].to_json(), "extend_lens": [1]})


def test_names_are_carried_verbatim(tmp_path):
    (s,) = _load(tmp_path, "name: 'odd[1]*name'\nmode: DECODE\nbatch: {prefix_lens: [3]}\n")
    assert s.name == "odd[1]*name"
    assert select_scenarios([s], globs=["odd*"]) == [s]


def test_mode_table_is_the_one_place_for_mode_rules():
    assert tuple(MODE_RULES) == MODES
    assert [m for m, r in MODE_RULES.items() if not r.graph] == ["EXTEND"]
    assert [m for m, r in MODE_RULES.items() if "glue" in r.builders] == ["DRAFT_EXTEND_V2"]
    assert [m for m, r in MODE_RULES.items() if r.takes_accept_lens] == ["DRAFT_EXTEND"]


# ------------------------------------------------------------------ through the CLI


def test_bad_scenario_file_on_the_cli_is_one_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(BAD[0][0])
    assert_one_line_error(run_cli("run", "--scenario-file", str(f), "--device", "cpu"), "bad.yaml:2:")
    assert_one_line_error(run_cli("run", "-s", "no-such-scenario*", "--device", "cpu"), "no scenario matches")
    assert_one_line_error(run_cli("run", "-r", "99999", "--device", "cpu"), "not registered")
    assert_one_line_error(run_cli("run", "--device", "tpu"), "--device")
    g = tmp_path / "grid.yaml"
    g.write_text(
        "name: g\nmode: DECODE\nbatch: {prefix_lens: [3]}\ngrid:\n  seed: ["
        + ", ".join(map(str, range(1000)))
        + "]\n  page_size: ["
        + ", ".join(map(str, range(1, 1001)))
        + "]\n"
    )
    t0 = time.monotonic()
    assert_one_line_error(run_cli("scenarios", "--scenario-file", str(g)), "grid.yaml:4:", "grid expands to 1000000")
    assert time.monotonic() - t0 < 30


def test_a_scenario_file_written_by_someone_else_runs_unchanged(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text(USER_FILE)
    out = tmp_path / "r.json"
    r = run_cli("run", "--scenario-file", str(f), "--device", "cpu", "--json", str(out), timeout=600, subprocess=True)
    assert r.code == 0, r.out + r.err
    data = json.loads(out.read_text())
    assert [c["scenario"] for c in data["cells"]] == ["my-verify-check"]
    assert data["cells"][0]["verdict"] == "PASS"
    assert data["cells"][0]["error"]["rows"] == 9  # 3 requests x 3 draft tokens compared


ZERO_AND_WIDE = """\
scenarios:
  - name: zero-extend
    mode: extend
    batch: {prefix_lens: [0, 0, 7], extend_lens: [3, 17, 2]}
  - name: zero-decode
    mode: Decode
    batch: {prefix_lens: [0, 5]}
    cuda_graph: {capture_bs: [4]}
  - name: zero-verify
    mode: target_verify
    batch: {prefix_lens: [0, 9]}
    cuda_graph: {capture_bs: [2]}
    gpu_only: true
  - name: zero-draft-extend
    mode: draft_extend
    batch: {prefix_lens: [0, 4], accept_lens: [2, 0]}
  - name: zero-draft-extend-v2
    mode: draft_extend_v2
    batch: {prefix_lens: [0, 11]}
    builder: glue
  - name: wide-decode
    mode: DECODE
    batch: {prefix_lens: [WIDE]}
    model: {num_heads: 1, num_kv_heads: 1, head_dim: 16, dtype: FLOAT16}
""".replace("WIDE", ", ".join(str(i % 4) for i in range(40)))


def test_zero_prefixes_lowercase_modes_and_40_requests_run_and_pass(tmp_path):
    """Each of these was refused at load (prefix 0, lowercase mode) or crashed (> 31 requests)."""
    f = tmp_path / "zero.yaml"
    f.write_text(ZERO_AND_WIDE)
    out = tmp_path / "r.json"
    r = run_cli("run", "--scenario-file", str(f), "--device", "cpu", "--json", str(out), timeout=600, subprocess=True)
    assert r.code == 0, r.out + r.err
    verdicts = {c["scenario"]: c["verdict"] for c in json.loads(out.read_text())["cells"]}
    assert verdicts == dict.fromkeys(
        ("zero-extend", "zero-decode", "zero-verify", "zero-draft-extend", "zero-draft-extend-v2", "wide-decode"),
        "PASS",
    ), verdicts


def test_a_window_models_full_layer_is_read_and_refused_where_no_such_layer_runs(tmp_path):
    """model.full_layer: the full-attention layer of a window model (its window kept for the
    backend); without a window there is no other layer, and a draft mode runs the draft's own."""
    head = "name: w\nbackend: %s\nmode: %s\nbatch: {prefix_lens: [20, 5]}\n"
    (s,) = _load(tmp_path, head % ("flashinfer", "DECODE") + "model: {sliding_window: 8, full_layer: true}\n")
    assert s.model.full_layer and s.model.sliding_window == 8
    assert Scenario.from_json(json.loads(json.dumps(s.to_json()))) == s
    (plain,) = _load(tmp_path, head % ("flashinfer", "DECODE") + "model: {sliding_window: 8}\n")
    assert not plain.model.full_layer
    msg = _refused(tmp_path, head % ("flashinfer", "DECODE") + "model: {full_layer: true}\n")
    assert "model.full_layer" in msg and "without model.sliding_window" in msg and "\n" not in msg, msg
    msg = _refused(tmp_path, head % ("triton", "DRAFT_DECODE") + "model: {sliding_window: 8, full_layer: true}\n")
    assert "the draft's own layer" in msg and "\n" not in msg, msg
