"""The forward modes a scenario may use and what each implies, in one table, plus the
backends and what each of them runs.

Every mode- and backend-dependent rule of the loader and of the memory estimate reads these
tables: how many new tokens a request brings, which batch keys the mode takes, whether it can
be captured in a CUDA graph, whether ``gpu_only`` applies, the largest ``spec.topk`` the
reproduction supports, which builders can make its batch, and which modes, page sizes, dtypes
and model shapes each backend takes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sglfix.scenario.limits import MAX_TOPK

__all__ = [
    "BACKENDS",
    "BACKEND_RULES",
    "BUILDERS",
    "MODES",
    "MODE_RULES",
    "PROBES",
    "PROBE_RULES",
    "BackendRule",
    "ModeRule",
    "ProbeRule",
    "backend_rule",
    "probe_rule",
    "rule_for",
]

BUILDERS = ("kit", "glue")


@dataclass(frozen=True)
class ModeRule:
    name: str
    # Where a request's new tokens come from: "extend_lens" (given), "one", "draft"
    # (spec.num_draft_tokens), "accept" (accept_lens + 1) or "draft_steps" (topk * num_steps
    # draft slots of a multi-step draft).
    new_tokens: str
    graph: bool
    gpu_only: bool
    max_topk: int
    builders: tuple[str, ...]
    # Spec-v1 DRAFT_EXTEND reads accept lengths on the host by design: never declared sync-free.
    host_reads: bool = False
    # TARGET_VERIFY builds a draft tree of num_draft_tokens nodes, depth <= num_steps.
    draft_tree: bool = False
    # batch.accept_lens: required (True) or refused (False).
    needs_accept_lens: bool = False
    # Every request brings the same number of new tokens (a diffusion LM's canvas, its block size):
    # a captured graph lays out that many query rows per request.
    canvas: bool = False
    # The shortest prefix the engine runs this mode on: a decode, a verify or a draft follows the
    # prompt's prefill, so a request has committed at least one token. The schema still takes 0
    # (a kernel's layout case); ``sglfix search`` draws and shrinks only what the engine reaches
    # (on CUDA, Triton's split heuristic gives a zero-length row no split: NaN, never served).
    engine_min_prefix: int = 0

    @property
    def takes_extend_lens(self) -> bool:
        return self.new_tokens == "extend_lens"

    @property
    def takes_accept_lens(self) -> bool:
        return self.needs_accept_lens

    def new_token_counts(
        self,
        *,
        batch_size: int,
        extend_lens: tuple[int, ...] | None,
        accept_lens: tuple[int, ...] | None,
        num_draft_tokens: int,
        topk: int = 1,
        num_steps: int = 1,
    ) -> tuple[int, ...]:
        if self.new_tokens == "one":
            return (1,) * batch_size
        if self.new_tokens == "draft":
            return (num_draft_tokens,) * batch_size
        if self.new_tokens == "draft_steps":
            return (topk * num_steps,) * batch_size
        if self.new_tokens == "accept":
            return tuple(a + 1 for a in accept_lens or ())
        return tuple(extend_lens or ())

    def graph_tokens_per_request(self, *, num_steps: int, num_draft_tokens: int, canvas: int = 1) -> int:
        """Query rows a captured graph lays out per request (the runner's num_tokens_per_bs);
        ``canvas``: a canvas mode's width."""
        if self.canvas:
            return canvas
        if self.new_tokens == "one":
            return 1
        if self.new_tokens == "accept":
            return num_steps + 1
        if self.new_tokens == "draft_steps":
            return num_steps
        return num_draft_tokens


_RULES = (
    ModeRule(
        "DECODE", new_tokens="one", graph=True, gpu_only=True, max_topk=MAX_TOPK, builders=("kit",), engine_min_prefix=1
    ),
    ModeRule("EXTEND", new_tokens="extend_lens", graph=False, gpu_only=False, max_topk=MAX_TOPK, builders=("kit",)),
    ModeRule(
        "TARGET_VERIFY",
        new_tokens="draft",
        graph=True,
        gpu_only=True,
        max_topk=MAX_TOPK,
        builders=("kit",),
        draft_tree=True,
        engine_min_prefix=1,
    ),
    ModeRule(
        "DRAFT_EXTEND",
        new_tokens="accept",
        graph=True,
        gpu_only=True,
        max_topk=1,
        builders=("kit",),
        host_reads=True,
        needs_accept_lens=True,
        engine_min_prefix=1,
    ),
    ModeRule(
        "DRAFT_EXTEND_V2",
        new_tokens="draft",
        graph=True,
        gpu_only=True,
        max_topk=MAX_TOPK,
        builders=("kit", "glue"),
        engine_min_prefix=1,
    ),
    # The multi-step EAGLE draft: num_steps - 1 decode steps, topk branches per request, each
    # step attending the prefix plus the branch's own draft path.
    ModeRule(
        "DRAFT_DECODE",
        new_tokens="draft_steps",
        graph=True,
        gpu_only=False,
        max_topk=MAX_TOPK,
        builders=("kit",),
        engine_min_prefix=1,
    ),
    # A diffusion LM's block extend (sglang's DLLM_EXTEND, under --dllm-algorithm): each request
    # denoises a canvas of block-size tokens, which attend the encoded context and each other
    # (both ways); captured by the decode graph runner at that width.
    ModeRule(
        "DLLM_EXTEND",
        new_tokens="extend_lens",
        graph=True,
        gpu_only=False,
        max_topk=MAX_TOPK,
        builders=("kit",),
        canvas=True,
    ),
)
MODE_RULES: dict[str, ModeRule] = {r.name: r for r in _RULES}
MODES: tuple[str, ...] = tuple(MODE_RULES)


@dataclass(frozen=True)
class BackendRule:
    """What one ``backend:`` runs and which scenarios it takes."""

    name: str
    modes: tuple[str, ...]
    mla: bool
    dtypes: tuple[str, ...]
    page_sizes: tuple[int, ...] | None  # None: any
    gpu_only: bool
    # page_size when a scenario gives none.
    default_page_size: int = 1
    # Whether gpu_only scenarios are declared free of device->host syncs (the FlashInfer
    # stand-ins plan on the host, so theirs are not).
    sync_free: bool = False
    # Query heads the GPU kernels take (None: any); GQA head dims and group sizes likewise.
    num_heads: tuple[int, ...] | None = None
    head_dims: tuple[int, ...] | None = None
    max_group: int | None = None
    # (mode, rule) replacements: how this backend lays out a mode's batch.
    mode_overrides: tuple[tuple[str, ModeRule], ...] = ()
    # What runs: on the GPU / on CPU.
    kernels: str = ""
    # Modes a sliding-window layer (model.sliding_window) runs in; () takes none.
    sliding_window_modes: tuple[str, ...] = ()
    # Modes an encoder-decoder batch (batch.encoder_lens, model.cross_attention) runs in; () takes none.
    encoder_decoder_modes: tuple[str, ...] = ()
    # Modes an MLA model's multi-head prefill (model.mha_chunk) runs in; () takes none.
    mha_prefill_modes: tuple[str, ...] = ()
    # Modes a multi-item scoring batch (batch.items, sglang's --enable-mis) runs in; () takes none.
    multi_item_modes: tuple[str, ...] = ()
    # Whether a TARGET_VERIFY takes batch.accept_lens: the worker's commit after the verify (a
    # hybrid model's linear states at each request's last accepted step).
    verify_commit: bool = False
    # The MLA backend a hybrid builds for its full-attention layers where the model is MLA
    # (model.kv_lora_rank: Kimi-Linear's); "" where it builds none.
    mla_child: str = ""
    # Modes a decode context-parallel cell (dcp_size > 1: every rank's metadata, one process) runs in.
    dcp_modes: tuple[str, ...] = ()

    def has_mla_child(self, model: Any) -> bool:
        """Whether this backend builds an MLA child for ``model`` (a ModelShape as written): a
        hybrid whose scenario gives the latent's shape (model.kv_lora_rank or qk_rope_head_dim)."""
        return bool(self.mla_child) and bool({"kv_lora_rank", "qk_rope_head_dim"} & model.model_fields_set)


_HALF = ("float16", "bfloat16")
_BACKEND_RULES = (
    BackendRule(
        "triton",
        # DRAFT_DECODE (its multi-step draft backend, sglang.triton_draft) and DLLM_EXTEND (a
        # diffusion LM's block extend) on real sglang only.
        modes=("DECODE", "EXTEND", "TARGET_VERIFY", "DRAFT_EXTEND", "DRAFT_EXTEND_V2", "DRAFT_DECODE", "DLLM_EXTEND"),
        mla=False,
        dtypes=("float16", "bfloat16", "float32"),
        page_sizes=None,
        gpu_only=True,
        sync_free=True,
        kernels="Triton kernels (compiled on CUDA, interpreted on CPU)",
        sliding_window_modes=("DECODE", "EXTEND", "TARGET_VERIFY", "DRAFT_EXTEND_V2", "DRAFT_DECODE"),
        # Real sglang only: TritonAttnBackend's per-rank KV indices (_dcp_kv_indices) for a decode
        # (eager and graph) and a prefill's cached prefix.
        dcp_modes=("DECODE", "EXTEND"),
    ),
    # Real sglang runs every mode of it (sglang.flashinfer_dense); the reproduction models the
    # decode and the draft only (its profile's backend_modes).
    BackendRule(
        "flashinfer",
        modes=("DECODE", "EXTEND", "TARGET_VERIFY", "DRAFT_EXTEND_V2", "DRAFT_DECODE"),
        mla=False,
        dtypes=_HALF,
        page_sizes=(1,),
        # FlashInfer plans on the host: it keeps sglang's default needs_cpu_seq_lens, so spec v2
        # publishes the CPU mirrors for it (gpu_only does not apply).
        gpu_only=False,
        head_dims=(64, 128, 256),
        max_group=4,
        # Real sglang only: a plain EXTEND captured by the prefill runner's full backend (its
        # full-graph prefill wrappers); capture_bs are then its token buckets.
        mode_overrides=(("EXTEND", replace(MODE_RULES["EXTEND"], graph=True)),),
        kernels="FlashInfer's paged decode / paged and ragged prefill wrappers on CUDA, torch kernels over "
        "the same plans on CPU; draft kv_indices by the Triton kernel generate_draft_decode_kv_indices",
        sliding_window_modes=("DECODE", "EXTEND", "TARGET_VERIFY"),
        # Its cross-attention wrappers (real sglang only): the speculative inputs build their page
        # tables without the encoder offset, so an encoder-decoder batch is DECODE or EXTEND.
        encoder_decoder_modes=("DECODE", "EXTEND"),
        # Multi-item scoring (real sglang only): a prefill-only batch, its item mask handed to the
        # paged prefill wrapper (_process_multi_item_scoring).
        multi_item_modes=("EXTEND",),
    ),
    # Real sglang runs every mode but the spec-v1 draft extend (sglang.flashinfer_mla_dense); the
    # reproduction models the decode and the draft only (its profile's backend_modes).
    BackendRule(
        "flashinfer_mla",
        modes=("DECODE", "EXTEND", "TARGET_VERIFY", "DRAFT_EXTEND_V2", "DRAFT_DECODE"),
        mla=True,
        dtypes=_HALF,
        page_sizes=(1,),
        gpu_only=False,
        num_heads=(16, 32, 64, 128),
        # Its graph metadata captures DECODE and TARGET_VERIFY only.
        mode_overrides=(("DRAFT_EXTEND_V2", replace(MODE_RULES["DRAFT_EXTEND_V2"], graph=False)),),
        # Its chunk runner (FlashInferMhaChunkKVRunner) serves DeepSeek's MHA prefill, an extend.
        mha_prefill_modes=("EXTEND",),
        kernels="FlashInfer BatchMLAPagedAttentionWrapper on CUDA, a torch kernel over the same plans on "
        "CPU; draft kv_indices by the Triton kernel generate_draft_decode_kv_indices",
    ),
    # Its CUDA graphs capture a padded window of num_draft_tokens rows per request: both
    # draft-extend modes extend that window, accept_lens only feed spec_info.accept_length.
    BackendRule(
        "trtllm_mla",
        modes=("DRAFT_EXTEND", "DRAFT_EXTEND_V2"),
        mla=True,
        dtypes=_HALF,
        page_sizes=(32, 64),
        default_page_size=64,
        gpu_only=True,
        num_heads=(16, 32, 64, 128),
        mode_overrides=(
            ("DRAFT_EXTEND", replace(MODE_RULES["DRAFT_EXTEND"], new_tokens="draft", host_reads=False)),
            ("DRAFT_EXTEND_V2", replace(MODE_RULES["DRAFT_EXTEND_V2"], needs_accept_lens=True, builders=("kit",))),
        ),
        kernels="the trtllm-gen MLA kernel runs on Blackwell only: FlashInfer BatchMLAPagedAttentionWrapper "
        "on other GPUs, a torch kernel on CPU, both over the same block table, seq_lens_k and q "
        "layout",
    ),
    # Real sglang only: FlashMLA's decode kernel for decode, verify, the spec-v2 draft extend and
    # the multi-step draft (page size 64, causal chains: no tree mask), its FlashInfer-MLA parent
    # for the extend.
    BackendRule(
        "flashmla",
        modes=("DECODE", "EXTEND", "TARGET_VERIFY", "DRAFT_EXTEND_V2", "DRAFT_DECODE"),
        mla=True,
        dtypes=_HALF,
        page_sizes=(64,),
        default_page_size=64,
        gpu_only=True,
        num_heads=(16, 32, 64, 128),
        # Its multi-step draft backend refuses topk > 1 (a chain of pages).
        mode_overrides=(("DRAFT_DECODE", replace(MODE_RULES["DRAFT_DECODE"], max_topk=1)),),
        kernels="FlashMLA's dense decode kernel and scheduler where flash_mla is installed, a torch "
        "kernel over the same block table, lengths and schedule elsewhere; FlashInfer's MLA wrapper "
        "(or its torch stand-in) for EXTEND",
    ),
    # Real sglang only: its forward reads the batch request by request (no metadata, no graphs).
    BackendRule(
        "torch_native",
        modes=("DECODE", "EXTEND"),
        mla=False,
        dtypes=("float16", "bfloat16", "float32"),
        page_sizes=None,
        gpu_only=False,
        mode_overrides=(("DECODE", replace(MODE_RULES["DECODE"], graph=False, gpu_only=False)),),
        kernels="torch's scaled_dot_product_attention per request, on any device",
        sliding_window_modes=("DECODE", "EXTEND"),
    ),
    # Real sglang only: a full-attention set (its Triton backend) and a gated-delta-net set under
    # one HybridLinearAttnBackend; it captures decode and target verify, and a Kimi-Linear prefill
    # under breakable graphs.
    BackendRule(
        "hybrid_linear",
        modes=("DECODE", "EXTEND", "TARGET_VERIFY"),
        mla=False,
        dtypes=("float16", "bfloat16"),
        page_sizes=None,
        gpu_only=False,
        kernels="the full-attention layers' Triton kernels (compiled on CUDA, interpreted on CPU), or "
        "FlashInfer's under multi-item scoring; the linear layers' metadata judged against the batch",
        # Multi-item scoring (real sglang only): GDN's query segments and item branches
        # (build_gdn_mis_metadata), the full-attention layers over FlashInfer, the one backend
        # sglang scores items with.
        multi_item_modes=("EXTEND",),
        # The worker's post-verify commit (update_mamba_state_after_mtp_verify).
        verify_commit=True,
        # Kimi-Linear's full-attention layers are MLA: FlashInferMLAAttnBackend under the hybrid.
        mla_child="flashinfer_mla",
        # A plain EXTEND captured by the prefill runner's breakable backend, a Kimi-Linear hybrid's
        # (cuda_graph.breakable): its delta-attention extend on the bucket tables it captured.
        mode_overrides=(("EXTEND", replace(MODE_RULES["EXTEND"], graph=True)),),
    ),
    # DSv4 pins page size 256 and topk <= 1; its draft layer attends a sliding window of 128.
    BackendRule(
        "deepseek_v4",
        modes=("DECODE", "DRAFT_DECODE"),
        mla=True,
        dtypes=_HALF,
        page_sizes=(256,),
        default_page_size=256,
        gpu_only=False,
        num_heads=(16, 32, 64, 128),
        mode_overrides=(("DRAFT_DECODE", replace(MODE_RULES["DRAFT_DECODE"], max_topk=1)),),
        kernels="Triton kernels for the KV write at the locations baked into its metadata and the "
        "sliding-window MLA decode (compiled on CUDA, interpreted on CPU)",
    ),
)
BACKEND_RULES: dict[str, BackendRule] = {r.name: r for r in _BACKEND_RULES}
BACKENDS: tuple[str, ...] = tuple(BACKEND_RULES)


def backend_rule(backend: str) -> BackendRule:
    return BACKEND_RULES[backend]


def rule_for(mode: str, backend: str = "triton") -> ModeRule:
    """The mode's rule as ``backend`` runs it."""
    rule = backend_rule(backend)
    for name, override in rule.mode_overrides:
        if name == mode:
            return override
    return MODE_RULES[mode]


@dataclass(frozen=True)
class ProbeRule:
    """What one ``probe:`` judges and which scenarios it takes.

    A probe scenario names a probe instead of a backend: the probe runs one engine function that
    lives outside any attention backend on inputs built from the scenario's fields, and judges a
    stated property against sglfix's own expectation. Which code base has which probe is declared
    on the code base (``sglfix.codebases``); this table is what a scenario file may say.
    """

    name: str
    modes: tuple[str, ...]
    # The property judged, in words (and the verdict when it does not hold).
    judges: str
    # Optional scenario keys the probe reads besides mode, batch and seed; a probe scenario that
    # gives another one is refused (it would change nothing).
    reads: tuple[str, ...] = ()
    page_sizes: tuple[int, ...] | None = None  # None: any
    # Positions a request's prefix must leave below max_context_len (None: no rule): a state the
    # engine never reaches is not judged.
    prefix_margin: int | None = None
    # The probe replays a CUDA graph: the scenario must give cuda_graph.capture_bs.
    needs_graph: bool = False


# Keys a probe scenario may give whatever its probe (name, description, mode, batch, seed, grid).
PROBE_COMMON_KEYS = ("name", "description", "probe", "mode", "batch", "seed", "grid")
_PROBE_RULES = (
    ProbeRule(
        "req-to-token-headroom",
        modes=("DECODE",),
        judges="each request's spec-v2 decode allocation (page-aligned committed + decode reserve, and sglfix's "
        "own draft footprint) ends inside its req_to_token row of max_context_len + headroom, and the "
        "row write leaves the neighbour rows intact (INVARIANT otherwise); prefix_lens are the committed "
        "lengths, max_context_len the model's context length (default: the longest prefix + 3), dcp_size the decode "
        "context-parallel ranks (the allocator's page is page_size x dcp_size)",
        reads=("spec", "page_size", "max_context_len", "dcp_size"),
        # sglang admits a request of at most max_context_len - 2 tokens in all, so a decode step
        # sees a committed length of at most max_context_len - 3.
        prefix_margin=3,
    ),
    ProbeRule(
        "eagle-prefill-tail",
        modes=("EXTEND",),
        judges="the EAGLE draft input rotation's tail token: the next prompt token for the batch's last request "
        "(a chunked prefill whose prompt continues), the target's next token for the others "
        "(DIVERGE otherwise)",
    ),
    ProbeRule(
        "draft-positions",
        modes=("DRAFT_DECODE",),
        judges="the multi-step EAGLE draft runs step i at position seq_len + i for every branch (DIVERGE otherwise)",
        reads=("model", "spec", "page_size", "max_context_len"),
        page_sizes=(1,),
    ),
    ProbeRule(
        "needs-cpu-seq-lens",
        modes=("DECODE", "TARGET_VERIFY", "DRAFT_EXTEND_V2"),
        judges="whether spec v2 must publish seq_lens_cpu: the OR of the present attention backends' "
        "needs_cpu_seq_lens, a backend without the flag counting as True and an unset slot as absent; "
        "gpu_only: the draft-extend slot is unset, else it holds a backend that declares no flag "
        "(DIVERGE otherwise)",
        reads=("spec", "gpu_only"),
    ),
    ProbeRule(
        "draft-extend-view",
        modes=("DRAFT_EXTEND_V2",),
        judges="the batch view the spec-v2 draft-extend CUDA-graph runner hands its attention backend on replay: "
        "every per-request tensor has the replayed bucket's batch_size rows (padded rows: request row 0, the fill "
        "length), no CPU mirror where the batch has none, and num_padding = bucket - requests (INVARIANT otherwise)",
        reads=("spec", "gpu_only", "cuda_graph"),
        needs_graph=True,
    ),
    ProbeRule(
        "draft-extend-idle",
        modes=("DRAFT_EXTEND_V2",),
        judges="an idle rank's spec-v2 draft extend (no requests, an EagleDraftExtendInput as spec_info) through the "
        "production glue and the eager runner's metadata init on the Triton and FlashInfer backends: the metadata "
        "describes zero requests (CRASH if the backend fails on it, INVARIANT if it plans requests); prefix_lens "
        "only size the pools",
        reads=("spec", "gpu_only"),
    ),
    ProbeRule(
        "verify-mask-fits",
        modes=("TARGET_VERIFY",),
        judges="where the EAGLE verify-input builder has the tree kernel write the verify mask, the Triton backend's "
        "graph state sized for one request fewer than the batch: the cells the kernel writes (FULL_MASK: "
        "num_draft_tokens x (seq_len + num_draft_tokens) per request) fit the buffer it is handed, and the batch "
        "of its first max_bs requests, which a graph replay takes, writes into the backend's buffer (INVARIANT "
        "otherwise); prefix_lens are the committed lengths (at least two requests)",
        reads=("spec", "gpu_only", "max_context_len"),
    ),
    ProbeRule(
        "trtllm-capture-fallback",
        modes=("TARGET_VERIFY", "DRAFT_EXTEND_V2"),
        judges="which attention path the TRT-LLM MLA backend's forward_extend takes for a batch of the mode captured "
        "in a CUDA graph right after a prefill on cached prefixes that fell back to FlashInfer (chunked prefix "
        "caching off): the trtllm-gen MLA kernel, never the FlashInfer prefill wrappers planned for that prefill "
        "(INVARIANT otherwise); prefix_lens are the prefill's prefixes, each extended by num_draft_tokens",
        reads=("spec", "model", "page_size", "max_context_len"),
        page_sizes=(32, 64),
    ),
)
PROBE_RULES: dict[str, ProbeRule] = {r.name: r for r in _PROBE_RULES}
PROBES: tuple[str, ...] = tuple(PROBE_RULES)


def probe_rule(name: str) -> ProbeRule:
    return PROBE_RULES[name]
