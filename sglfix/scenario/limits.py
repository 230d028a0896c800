"""Upper bounds on every size a scenario file may ask for, checked when the file is loaded.

A scenario describes a real batch. The bounds sit well above what an engine runs (CUDA graphs of
a few hundred requests, 128K-token contexts, EAGLE trees of tens of tokens) and far below what
would make a worker allocate tens of GB or loop for hours before reporting a CRASH or TIMEOUT
that is really a typo. Memory is bounded separately, by estimate (``memory.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "LIMITS",
    "LIMITS_HINT",
    "MAX_CAPTURE_SIZES",
    "MAX_DCP_SIZE",
    "MAX_DESCRIPTION_CHARS",
    "MAX_DRAFT_TOKENS",
    "MAX_FILE_BYTES",
    "MAX_GRID_POINTS",
    "MAX_HEADS",
    "MAX_HEAD_DIM",
    "MAX_NAME_CHARS",
    "MAX_NUM_STEPS",
    "MAX_PAGE_SIZE",
    "MAX_REQUESTS",
    "MAX_SCENARIOS",
    "MAX_SEED",
    "MAX_TOKENS_PER_BATCH",
    "MAX_TOKENS_PER_REQUEST",
    "MAX_TOPK",
    "MIN_HEAD_DIM",
    "Limit",
    "limits_markdown",
]

MAX_REQUESTS = 1024
MAX_TOKENS_PER_REQUEST = 131_072
MAX_TOKENS_PER_BATCH = 1_048_576
MAX_HEADS = 256
MIN_HEAD_DIM = 16
MAX_HEAD_DIM = 512
MAX_PAGE_SIZE = 1024
# Decode context-parallel ranks (sglang's --dcp-size): its allocator pages page_size * dcp_size.
MAX_DCP_SIZE = 64
MAX_TOPK = 16
MAX_NUM_STEPS = 32
MAX_DRAFT_TOKENS = 256
MAX_CAPTURE_SIZES = 64
MAX_GRID_POINTS = 512
MAX_SCENARIOS = 4096
MAX_FILE_BYTES = 1024 * 1024
MAX_NAME_CHARS = 200
MAX_DESCRIPTION_CHARS = 4000
MAX_SEED = 2**63 - 1

LIMITS_HINT = "see docs/reference/scenario-files.md, Scenario limits"


@dataclass(frozen=True)
class Limit:
    """One documented bound: where it applies, its value and why it is there."""

    applies_to: str
    value: str
    why: str


LIMITS: tuple[Limit, ...] = (
    Limit(
        "requests per batch (`batch.prefix_lens` items)",
        f"1 .. {MAX_REQUESTS}",
        "CUDA-graph batch sizes of engines stay in the hundreds",
    ),
    Limit(
        "tokens per request (prefix + new tokens)",
        f"<= {MAX_TOKENS_PER_REQUEST:,}",
        "a 128K context; an encoder-decoder batch's encoder tokens count too",
    ),
    Limit(
        "tokens per batch (sum over requests)",
        f"<= {MAX_TOKENS_PER_BATCH:,}",
        "the KV pool holds twice this (scattered pages)",
    ),
    Limit(
        "`batch.prefix_lens`",
        f"0 .. {MAX_TOKENS_PER_REQUEST:,}",
        "0 is a fresh prefill (or a first token attending only itself)",
    ),
    Limit("`batch.extend_lens`", f"1 .. {MAX_TOKENS_PER_REQUEST:,}", "EXTEND only"),
    Limit(
        "`batch.accept_lens`",
        "0 .. min(num_steps, num_draft_tokens - 1)",
        "DRAFT_EXTEND only; it extends accept_len + 1 tokens (trtllm_mla: both draft-extend modes, "
        "0 .. num_draft_tokens - 1, fed to spec_info.accept_length; real sglang hybrid_linear: TARGET_VERIFY, "
        "the worker's commit after the verify, a tree accepting along its first path that deep)",
    ),
    Limit(
        "`batch.mamba_track`",
        "EXTEND: 0, or 64 .. the request's extend; DECODE: 0 or 1",
        "real sglang `hybrid_linear`. EXTEND: the tokens of a request's extend its tracked Mamba state "
        "covers (sglang's `mamba_track_seqlens` - prefix); at least one 64-token chunk (the page where "
        "larger); an aligned length must be the whole extend (the scheduler asks for an earlier boundary "
        "as boundary + 1). DECODE: 1 where this step's state is snapshotted",
    ),
    Limit(
        "`batch.encoder_lens`",
        f"1 .. {MAX_TOKENS_PER_REQUEST:,}, one per request",
        "real sglang `flashinfer`, DECODE and EXTEND: an encoder-decoder model's (Mllama, Whisper) encoder "
        "tokens, cached in each request's req_to_token row ahead of its decoder tokens (prefix_lens and "
        "new tokens count the decoder's); they count in the request's tokens and `max_context_len`; no "
        "`model.sliding_window` beside them",
    ),
    Limit(
        "`batch.items`",
        "per request: a list of item lengths (0 .. 131,072 each), or null",
        "real sglang `flashinfer` and `hybrid_linear` (GDN over FlashInfer, page size 1, no cached prefix, at "
        "least one item per scored request, every request scored or none: GDN scores a prefill-only batch), "
        "EXTEND, eager: a multi-item scoring batch (--enable-mis): each "
        "request's new "
        "tokens are its query (at least one token), a delimiter before every item and one after the last; "
        "null, a request without delimiters (every request null: a batch with no delimiter lists); no "
        "`encoder_lens` or `model.sliding_window` beside it",
    ),
    Limit(
        "`env`", "<= 16 `SGLANG_*` flags", "real sglang: flags its `srt/environ.py` declares, values its parser takes"
    ),
    Limit(
        "`max_context_len`",
        f"1 .. {MAX_TOKENS_PER_REQUEST:,}",
        "optional; at least every request's prefix + new tokens (DRAFT_DECODE: + topk * num_steps; an "
        "encoder-decoder batch: + its encoder tokens)",
    ),
    Limit(
        "`model.num_heads`, `model.num_kv_heads`",
        f"1 .. {MAX_HEADS}",
        "num_heads a multiple of num_kv_heads (MHA, GQA, MQA)",
    ),
    Limit(
        "`model.head_dim`",
        f"power of two, {MIN_HEAD_DIM} .. {MAX_HEAD_DIM}",
        "the Triton kernels' block shapes; flashinfer: 64, 128 or 256, at most 4 query heads per KV head",
    ),
    Limit(
        "`model.kv_lora_rank`, `model.qk_rope_head_dim`",
        "512, 64",
        "MLA backends only (flashinfer_mla, flashmla, trtllm_mla, deepseek_v4), and real sglang `hybrid_linear` with "
        "`model.linear_attention: kda` (Kimi-Linear: FlashInferMLAAttnBackend for the full-attention layers): "
        "FlashInfer's MLA kernels; num_heads 16, 32, 64 or 128",
    ),
    Limit(
        "`model.sliding_window`",
        "1 .. 131,072",
        "optional: a sliding-window layer (a query at position p sees keys p - window .. p), on real sglang (the "
        "reproduction has no window): triton in DECODE, EXTEND, TARGET_VERIFY, DRAFT_EXTEND_V2 and DRAFT_DECODE, "
        "flashinfer in DECODE, EXTEND and TARGET_VERIFY, torch_native in DECODE and EXTEND",
    ),
    Limit(
        "`model.full_layer`",
        "true / false",
        "optional, needs `model.sliding_window`, DECODE, EXTEND and TARGET_VERIFY: the window model's "
        "full-attention layer. The backend keeps the window and builds the metadata of both kinds of layer "
        "(FlashInfer a wrapper each, Triton a window rail beside the full KV); the cell runs the layer without "
        "a window, judged against attention over every cached key",
    ),
    Limit(
        "`model.linear_attention`",
        "gdn, kda, mamba2, short_conv",
        "real sglang `hybrid_linear` only: the linear-attention layer set, Qwen3-Next's gated delta net "
        "(GDNAttnBackend, the default), Kimi-Linear's delta attention (KDAAttnBackend), a Mamba2 mixer "
        "(Mamba2AttnBackend) or LFM2's short convolution (ShortConvAttnBackend, which the model reaches through "
        "the hybrid's `conv_state_metadata`)",
    ),
    Limit(
        "`model.cross_attention`",
        "true, false",
        "with `batch.encoder_lens` only: true, the layer is the model's cross-attention layer (called with no "
        "K/V of its own; each query sees its request's encoder tokens, all of them, and no decoder token); "
        "false, its self-attention layer (the decoder's keys, after the encoder's in the row)",
    ),
    Limit(
        "`model.ple_states`",
        "true, false",
        "real sglang `hybrid_linear`, a TARGET_VERIFY with `batch.accept_lens` only: the model keeps "
        "per-layer-embedding side states (Qwen4-Exp's PLE: a short-conv window and an N-gram context per "
        "request) in the hybrid pool's state slots, which the commit after the verify rolls forward too",
    ),
    Limit(
        "`model.replayssm_ring`",
        "2 .. 64",
        "real sglang `hybrid_linear` (gated delta net) in DECODE only: ReplaySSM (--enable-linear-replayssm), a "
        "ring of this many decode steps per state slot with a write cursor; its snapshot, flush (on the radix "
        "track boundary, interval 8 here) and advance are judged after every init",
    ),
    Limit(
        "`model.mha_chunk`",
        f"1 .. {MAX_TOKENS_PER_REQUEST:,}",
        "real sglang `flashinfer_mla` (and a Kimi-Linear `hybrid_linear`) in EXTEND, eager: the MLA model's "
        "multi-head prefill (DeepSeek's: the "
        "latent decompressed per head by kv_b_proj, the cached prefix attended in chunks of this many tokens, "
        "SGLANG_MAX_KV_CHUNK_CAPACITY, merged with the new tokens' causal attention; one shot where every "
        "sequence of the batch fits), the method sglang's own dispatcher picks",
    ),
    Limit(
        "`page_size`",
        f"1 .. {MAX_PAGE_SIZE}",
        "engines use 1 to 256; flashinfer and flashinfer_mla: 1; "
        "trtllm_mla: 32 or 64 (default 64); flashmla: 64; deepseek_v4: 256 (the default)",
    ),
    Limit(
        "`dcp_size`",
        f"1 .. {MAX_DCP_SIZE}",
        "decode context-parallel ranks (the allocator's page is page_size x dcp_size); probe req-to-token-headroom, "
        "and triton in DECODE and EXTEND on real sglang",
    ),
    Limit("`spec.topk`", f"1 .. {MAX_TOPK}", "DRAFT_EXTEND, deepseek_v4 and flashmla's DRAFT_DECODE: 1"),
    Limit(
        "`spec.num_steps`",
        f"1 .. {MAX_NUM_STEPS}",
        "EAGLE draft depth; DRAFT_DECODE: >= 2 (num_steps - 1 attention steps)",
    ),
    Limit(
        "`spec.num_draft_tokens`",
        f"1 .. {MAX_DRAFT_TOKENS}",
        "TARGET_VERIFY: must fit a tree of depth num_steps and fan-out topk",
    ),
    Limit(
        "`cuda_graph.capture_bs`",
        f"1 .. {MAX_REQUESTS} each, at most {MAX_CAPTURE_SIZES} sizes",
        "one capture per size; an EXTEND graph's (real sglang `flashinfer`: sglang's full prefill graph) are "
        "token counts, as sglang's prefill `bs`: the bucket its new tokens pad to must be at most twice them",
    ),
    Limit(
        "`cuda_graph.full_prefill_max_req`",
        f"1 .. {MAX_REQUESTS}",
        "EXTEND graphs only, and required there (not with `breakable`): the request slots each prefill graph is "
        "captured with (sglang's `full_prefill_max_req`), at least the batch's requests; the rest replay as "
        "zero-length sentinels",
    ),
    Limit(
        "`cuda_graph.breakable`",
        "true / false",
        "EXTEND graphs of `backend: hybrid_linear` with `model.linear_attention: kda` only (real sglang): sglang's "
        "breakable prefill backend, no request slots; the delta-attention extend's per-bucket tables judged after "
        "every capture and replay",
    ),
    Limit(
        "`cuda_graph.cpu`",
        "true / false",
        "DECODE graphs of `backend: hybrid_linear` only (real sglang), CPU cells only: sglang's CPU graph runner over "
        "its CPU attention backend (IntelAMXAttnBackend; a torch kernel over the same rows where sgl_kernel is not "
        "the CPU build); no `batch.mamba_track`, `model.replayssm_ring`, `model.sliding_window` or MLA beside it",
    ),
    Limit("`seed`", "0 .. 2^63 - 1", "torch.Generator.manual_seed"),
    Limit("`tolerance`", "0 < t < 1", "default 1e-2 fp16, 2e-2 bf16, 1e-4 fp32"),
    Limit(
        "`name`",
        f"1 .. {MAX_NAME_CHARS} characters, no whitespace or control characters",
        "names are printed and matched by glob",
    ),
    Limit("`grid` points per scenario", f"<= {MAX_GRID_POINTS}", "checked on the product, before expanding"),
    Limit(
        "scenarios loaded in all (after grid expansion)",
        f"<= {MAX_SCENARIOS}",
        "the matrix runs each with every toggle",
    ),
    Limit("scenario file size", f"<= {MAX_FILE_BYTES // 1024**2} MiB", "a scenario file is a few KB"),
)


def limits_markdown() -> str:
    """The limits as a Markdown table, for docs/reference/scenario-files.md."""
    rows = ["| what | allowed | note |", "|---|---|---|"]
    rows += [f"| {lim.applies_to} | {lim.value} | {lim.why} |" for lim in LIMITS]
    return "\n".join(rows)
