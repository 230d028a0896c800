"""pydantic models: a scenario as its file spells it (``ScenarioNode``) and as it runs (``Scenario``).

Field types carry the per-value rules (integers, not text or floats; each size within its limit;
mode, dtype, backend and builder names in any case, normalised to the canonical spelling), so an
error names the exact key or list item and its line. Rules that tie several keys together run
last, from ``rules.py``, driven by the mode table.
"""

from __future__ import annotations

import re
import unicodedata
from functools import partial
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from sglfix.common.schema import StrictModel, describe_kind, nearest, show, validate_node
from sglfix.scenario.limits import (
    LIMITS_HINT,
    MAX_CAPTURE_SIZES,
    MAX_DCP_SIZE,
    MAX_DESCRIPTION_CHARS,
    MAX_DRAFT_TOKENS,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_NAME_CHARS,
    MAX_NUM_STEPS,
    MAX_PAGE_SIZE,
    MAX_REQUESTS,
    MAX_SEED,
    MAX_TOKENS_PER_REQUEST,
    MAX_TOPK,
    MIN_HEAD_DIM,
)
from sglfix.scenario.modes import BACKENDS, BUILDERS, MODES, PROBES, backend_rule, rule_for
from sglfix.scenario.rules import check_node, new_token_counts

__all__ = [
    "BACKENDS",
    "DEFAULT_TOLERANCE",
    "DTYPES",
    "BatchNode",
    "CudaGraphNode",
    "ModelShape",
    "Scenario",
    "ScenarioNode",
    "SpecShape",
    "valid_name",
]

DTYPES = ("float16", "bfloat16", "float32")
DEFAULT_TOLERANCE = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-4}
_DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "float": "float32"}


# ----------------------------------------------------------------------------- value checks


def _integer(value: Any, *, low: int, high: int, limit: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        hint = ""
        if isinstance(value, str) and re.fullmatch(r"\s*[-+]?[\d_.]+(e[-+]?\d+)?\s*", value, re.I):
            hint = " (YAML reads this as text; write the digits)"
        raise ValueError(f"must be an integer, got {describe_kind(value)} {show(value)}{hint}")
    if value < low:
        raise ValueError(f"must be >= {low}, got {value}")
    if value > high:
        raise ValueError(f"{value} is over the limit of {limit} ({LIMITS_HINT})")
    return value


def bounded(low: int, high: int, limit: str) -> Any:
    """An int type within [low, high]; ``limit`` says what the upper bound is in words."""
    return Annotated[int, BeforeValidator(partial(_integer, low=low, high=high, limit=limit))]


def _power_of_two(value: int) -> int:
    if value & (value - 1):
        raise ValueError(f"must be a power of two, got {value}")
    return value


def _per_request(value: Any, *, items: str) -> Any:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"must be a list of {items}, one per request, got {describe_kind(value)} {show(value)}")
    if not value:
        raise ValueError(f"must be a non-empty list of {items}, got an empty list")
    if len(value) > MAX_REQUESTS:
        raise ValueError(f"has {len(value)} items, over the limit of {MAX_REQUESTS} requests ({LIMITS_HINT})")
    return value


def _item_lengths(value: Any) -> Any:
    # One request's items: a list of token counts; null: a request without multi-item structure.
    if value is None:
        return value
    if not isinstance(value, (list, tuple)):
        raise ValueError(
            f"must be a list of item lengths (or null for a request without items), got "
            f"{describe_kind(value)} {show(value)}"
        )
    if len(value) > MAX_TOKENS_PER_REQUEST:
        raise ValueError(f"has {len(value)} items, over the limit of {MAX_TOKENS_PER_REQUEST} tokens per request")
    return value


def _capture_sizes(value: Any) -> Any:
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"must be a non-empty list of batch sizes, got {describe_kind(value)} {show(value)}")
    if len(value) > MAX_CAPTURE_SIZES:
        raise ValueError(f"has {len(value)} sizes, over the limit of {MAX_CAPTURE_SIZES} ({LIMITS_HINT})")
    return value


def _choice(value: Any, *, choices: tuple[str, ...], canonical: Any, aliases: dict[str, str] | None = None) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be one of {', '.join(choices)}, got {describe_kind(value)} {show(value)}")
    key = canonical(value.strip())
    key = (aliases or {}).get(key, key)
    if key not in choices:
        raise ValueError(f"{show(value)} is not one of {', '.join(choices)}{nearest(key, choices)}")
    return key


def _name(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be text, got {describe_kind(value)} {show(value)}")
    if len(value) > MAX_NAME_CHARS:
        raise ValueError(f"has {len(value)} characters, over the limit of {MAX_NAME_CHARS}")
    for i, ch in enumerate(value):
        if ch.isspace() or unicodedata.category(ch)[0] == "C":
            raise ValueError(
                f"must be text without spaces or control characters, got {value!r} ({ch!r} at {i}); use - or _ instead"
            )
    return value


def valid_name(value: Any) -> bool:
    try:
        _name(value)
    except ValueError:
        return False
    return True


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be text, got {describe_kind(value)} {show(value)}")
    if len(value) > MAX_DESCRIPTION_CHARS:
        raise ValueError(f"has {len(value)} characters, over the limit of {MAX_DESCRIPTION_CHARS}")
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {describe_kind(value)} {show(value)}")
    return value


_ENV_NAME = re.compile(r"SGLANG_[A-Z0-9_]+")
MAX_ENV_FLAGS = 16


def _env(value: Any) -> dict[str, str]:
    """Engine flags by name: each an ``SGLANG_*`` name, its value a scalar, kept as the text the
    process environment holds (true/false for YAML's booleans)."""
    if not isinstance(value, dict) or not value:
        raise ValueError(
            f"must be a non-empty mapping of SGLANG_* flag names to values, got {describe_kind(value)} {show(value)}"
        )
    if len(value) > MAX_ENV_FLAGS:
        raise ValueError(f"has {len(value)} flags, over the limit of {MAX_ENV_FLAGS}")
    out: dict[str, str] = {}
    for name, v in value.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise ValueError(f"{show(name)} is not an engine flag name (SGLANG_ then capitals, digits and _)")
        if isinstance(v, bool):
            out[name] = "true" if v else "false"
        elif isinstance(v, (int, float, str)) and "\0" not in str(v):
            out[name] = str(v)
        else:
            raise ValueError(
                f"{name} must be a scalar (true/false, a number or text), got {describe_kind(v)} {show(v)}"
            )
    return dict(sorted(out.items()))


def _tolerance(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"must be a number in (0, 1), got {show(value)}")
    return float(value)


def _graph_or_false(value: Any) -> Any:
    # `cuda_graph: false` (or absent) is eager; true names no size to capture.
    if value is False or value is None:
        return None
    if isinstance(value, dict):
        return value
    raise ValueError(f"must be false or {{capture_bs: [...]}}, got {describe_kind(value)} {show(value)}")


Tokens = bounded(0, MAX_TOKENS_PER_REQUEST, f"{MAX_TOKENS_PER_REQUEST} tokens per request")
NewTokens = bounded(1, MAX_TOKENS_PER_REQUEST, f"{MAX_TOKENS_PER_REQUEST} tokens per request")
AcceptLen = bounded(0, MAX_DRAFT_TOKENS, f"{MAX_DRAFT_TOKENS} draft tokens")
BatchSize = bounded(1, MAX_REQUESTS, f"{MAX_REQUESTS} requests")
Heads = bounded(1, MAX_HEADS, f"{MAX_HEADS} heads")
HeadDim = Annotated[bounded(MIN_HEAD_DIM, MAX_HEAD_DIM, f"{MAX_HEAD_DIM}"), AfterValidator(_power_of_two)]
PageSize = bounded(1, MAX_PAGE_SIZE, f"{MAX_PAGE_SIZE} tokens per page")
Seed = bounded(0, MAX_SEED, "2^63 - 1")
ContextLen = bounded(1, MAX_TOKENS_PER_REQUEST, f"{MAX_TOKENS_PER_REQUEST} tokens per request")
DcpSize = bounded(1, MAX_DCP_SIZE, f"{MAX_DCP_SIZE} ranks")
# The only latent sizes FlashInfer's MLA kernels (and DeepSeek models) use.
MLA_KV_LORA_RANK = 512
MLA_ROPE_DIM = 64
PrefixList = Annotated[tuple[Tokens, ...], BeforeValidator(partial(_per_request, items="integers >= 0"))]
NewTokenList = Annotated[tuple[NewTokens, ...], BeforeValidator(partial(_per_request, items="integers >= 1"))]
AcceptList = Annotated[tuple[AcceptLen, ...], BeforeValidator(partial(_per_request, items="integers >= 0"))]
TrackList = Annotated[tuple[Tokens, ...], BeforeValidator(partial(_per_request, items="integers >= 0"))]
# Multi-item scoring: per request its items' token counts (null: a request without delimiters).
RequestItems = Annotated[tuple[Tokens, ...] | None, BeforeValidator(_item_lengths)]
ItemsList = Annotated[
    tuple[RequestItems, ...], BeforeValidator(partial(_per_request, items="lists of item lengths (or null)"))
]
CaptureList = Annotated[tuple[BatchSize, ...], BeforeValidator(_capture_sizes)]
Name = Annotated[str, BeforeValidator(_name)]
Text = Annotated[str, BeforeValidator(_text)]
Flag = Annotated[bool, BeforeValidator(_flag)]


def _sync_free(value: Any) -> bool | str:
    if value == "cuda" or isinstance(value, bool):
        return value
    raise ValueError(f"must be true, false or cuda, got {describe_kind(value)} {show(value)}")


# true / false, or ``cuda``: declared sync-free where the device is CUDA only. On CPU every tensor
# is a host tensor: the watch cannot tell a read of a host mirror (what a host-side plan is for)
# from a read of a device value, so there the cell says the promise was not judged.
SyncFree = Annotated[bool | Literal["cuda"], BeforeValidator(_sync_free)]
EnvMap = Annotated[
    dict[str, str],
    BeforeValidator(_env),
    WithJsonSchema(
        {
            "type": "object",
            "minProperties": 1,
            "maxProperties": MAX_ENV_FLAGS,
            "propertyNames": {"pattern": "^SGLANG_[A-Z0-9_]+$"},
            "additionalProperties": {"type": ["boolean", "number", "string"]},
        }
    ),
]
Tolerance = Annotated[float, BeforeValidator(_tolerance)]
Mode = Annotated[str, BeforeValidator(partial(_choice, choices=MODES, canonical=lambda s: s.upper().replace("-", "_")))]
DType = Annotated[
    str,
    BeforeValidator(
        partial(_choice, choices=DTYPES, aliases=_DTYPE_ALIASES, canonical=lambda s: s.lower().removeprefix("torch."))
    ),
]
Backend = Annotated[str, BeforeValidator(partial(_choice, choices=BACKENDS, canonical=str.lower))]
LinearAttention = Annotated[
    str, BeforeValidator(partial(_choice, choices=("gdn", "kda", "mamba2", "short_conv"), canonical=str.lower))
]
Builder = Annotated[str, BeforeValidator(partial(_choice, choices=BUILDERS, canonical=str.lower))]
ProbeName = Annotated[
    str, BeforeValidator(partial(_choice, choices=PROBES, canonical=lambda s: s.lower().replace("_", "-")))
]


# ----------------------------------------------------------------------------- shared shapes


class ModelShape(StrictModel):
    num_heads: Heads = 4
    # Validated even when left out: num_heads alone may not be a multiple of the default.
    num_kv_heads: Heads = Field(default=2, validate_default=True)
    head_dim: HeadDim = 64
    dtype: DType = "float16"
    # Multi-head latent attention (MLA backends only): the latent KV per token is
    # kv_lora_rank compressed values plus qk_rope_head_dim RoPE values, one KV head.
    kv_lora_rank: bounded(MIN_HEAD_DIM, MAX_HEAD_DIM, f"{MAX_HEAD_DIM}") | None = None
    qk_rope_head_dim: bounded(MIN_HEAD_DIM, MAX_HEAD_DIM, f"{MAX_HEAD_DIM}") | None = None
    # A sliding-window layer: a query at position p attends the keys at p - sliding_window .. p.
    sliding_window: bounded(1, MAX_TOKENS_PER_REQUEST, f"{MAX_TOKENS_PER_REQUEST} tokens per request") | None = None
    # A window model's full-attention layer (needs model.sliding_window): the backend holds the
    # metadata of both kinds of layer (FlashInfer a wrapper each, Triton a window rail beside the
    # full KV) and this runs the layer without a window, whose queries attend every cached key.
    full_layer: Flag = False
    # A hybrid model's linear-attention layer set (hybrid_linear): Qwen3-Next's gated delta net
    # (gdn, the default there), Kimi-Linear's delta attention (kda), a Mamba2 mixer (NemotronH,
    # Falcon-H1, Granite 4) or a short convolution (LFM2).
    linear_attention: LinearAttention | None = None
    # An encoder-decoder model's cross-attention layer (Mllama, Whisper; needs batch.encoder_lens):
    # its queries see the request's cached encoder tokens, all of them, and no decoder token.
    cross_attention: Flag = False
    # An MLA model's prefill through its multi-head path (DeepSeek's MHA prefill: the latent
    # decompressed per head, the cached prefix attended in chunks of this many tokens, sglang's
    # SGLANG_MAX_KV_CHUNK_CAPACITY; one shot where the whole batch fits).
    mha_chunk: bounded(1, MAX_TOKENS_PER_REQUEST, f"{MAX_TOKENS_PER_REQUEST} tokens") | None = None
    # A hybrid model with per-layer-embedding side states beside its linear layers' (Qwen4-Exp's PLE:
    # a short-conv window and an N-gram context per request, in the hybrid pool's state slots); the
    # commit after a verify (batch.accept_lens) rolls them forward with the linear states.
    ple_states: Flag = False
    # A hybrid model's gated-delta-net layers under ReplaySSM (sglang's --enable-linear-replayssm):
    # each state slot keeps a ring of its last this-many decode steps, a write cursor per slot.
    replayssm_ring: bounded(2, 64, "64 steps") | None = None

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None

    @field_validator("num_kv_heads")
    @classmethod
    def _heads_group(cls, value: int, info: ValidationInfo) -> int:
        heads = info.data.get("num_heads")
        if heads is not None and heads % value:
            raise ValueError(f"num_heads ({heads}) must be a multiple of num_kv_heads ({value})")
        return value


class SpecShape(StrictModel):
    topk: bounded(1, MAX_TOPK, f"{MAX_TOPK}") = 1
    num_steps: bounded(1, MAX_NUM_STEPS, f"{MAX_NUM_STEPS} steps") = 3
    num_draft_tokens: bounded(1, MAX_DRAFT_TOKENS, f"{MAX_DRAFT_TOKENS} draft tokens") = 4


# ----------------------------------------------------------------------------- the file's shape


class BatchNode(StrictModel):
    prefix_lens: PrefixList
    # One integer for every request, or one per request.
    extend_lens: Annotated[
        NewTokenList | None,
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "integer", "minimum": 1},
                    {"type": "array", "items": {"type": "integer", "minimum": 1}},
                ]
            }
        ),
    ] = None
    accept_lens: AcceptList | None = None
    # A prefill's Mamba state snapshot for prefix caching (sglang's mamba_track_*): per request, the
    # tokens of its extend the tracked state covers (mamba_track_seqlens - prefix), 0 for none.
    mamba_track: TrackList | None = None
    # Whether the scheduler hands its host-side track plan with the batch (production's extend
    # does); false: the device tensors alone, as a batch without host mirrors carries them.
    mamba_track_host: Flag | None = None
    # An encoder-decoder model's batch (Mllama, Whisper): per request, the encoder tokens cached
    # ahead of its decoder tokens in its req_to_token row (sglang's encoder_lens).
    encoder_lens: NewTokenList | None = None
    # A multi-item scoring batch (sglang's --enable-mis, the score API's packed prompts): per
    # request, its items' token counts; its new tokens are the query, then a delimiter before every
    # item and one after the last (null: a request without delimiters; every request null: a batch
    # that carries no delimiter lists, a generate batch under --enable-mis).
    items: ItemsList | None = None

    @field_validator("extend_lens", mode="wrap")
    @classmethod
    def _same_for_all(cls, value: Any, handler: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return _integer(
                value, low=1, high=MAX_TOKENS_PER_REQUEST, limit=f"{MAX_TOKENS_PER_REQUEST} tokens per request"
            )
        return handler(value)


class CudaGraphNode(StrictModel):
    # DECODE and the speculative modes: the batch sizes captured. EXTEND (sglang's full prefill
    # graph): the token buckets captured, as sglang's prefill config takes them in its `bs`.
    capture_bs: CaptureList
    # EXTEND only: the request slots every prefill graph is captured with (sglang's
    # cuda_graph_config.prefill.full_prefill_max_req); required there under the full backend.
    full_prefill_max_req: BatchSize | None = None
    # EXTEND only: sglang's prefill graph backend (cuda_graph_config.prefill.backend). full: the
    # whole prefill in one graph over fixed request slots; breakable: captured segments that break
    # at attention, a Kimi-Linear hybrid's delta-attention extend kept inside on the per-bucket
    # tables the backend captured (its captured-metadata contract).
    breakable: Flag = False
    # DECODE on a CPU device: sglang's CPU graph runner (CPUGraphRunner) over its CPU attention
    # backend (IntelAMXAttnBackend) for the full-attention layers of a hybrid: the backend's CPU
    # graph state and capture init, replays through the backend's eager init. A CPU cell only.
    cpu: Flag = False


class ScenarioNode(StrictModel):
    """One scenario as written (after grid expansion); cross-key rules come after, in resolve.py."""

    name: Name
    description: Text = ""
    backend: Backend = "triton"
    # Instead of a backend: a probe that runs one engine function outside any attention backend
    # on inputs built from this scenario (``modes.PROBE_RULES``); exactly one of the two.
    probe: ProbeName | None = None
    mode: Mode
    batch: BatchNode
    cuda_graph: Annotated[CudaGraphNode | None, BeforeValidator(_graph_or_false)] = None
    gpu_only: Flag = False
    sync_free: SyncFree | None = None
    # None: the backend's default (1; trtllm_mla 64; deepseek_v4 256).
    page_size: PageSize | None = None
    model: ModelShape = ModelShape()
    spec: SpecShape = SpecShape()
    seed: Seed = 0
    tolerance: Tolerance | None = None
    builder: Builder = "kit"
    # The engine's context length: sizes req_to_token rows and the CUDA-graph buffers
    # (default: the longest request plus headroom, rounded up to 32).
    max_context_len: ContextLen | None = None
    # Decode context-parallel ranks (sglang's --dcp-size): the KV allocator pages page_size x dcp_size.
    dcp_size: DcpSize = 1
    # sglang's --enable-deterministic-inference published for the backend: batch-invariant kernels
    # (fixed-size decode splits, the one-stage unified extend).
    deterministic: Flag = False
    # Engine flags (sglang's SGLANG_* environment switches) set for the cell's whole run, for the
    # paths the engine only takes behind a flag; checked against the code base's own flags.
    env: EnvMap | None = None
    # Expanded by the loader before a node is validated; listed so that it is a known key.
    grid: dict | None = None

    @property
    def effective_page_size(self) -> int:
        return self.page_size if self.page_size is not None else backend_rule(self.backend).default_page_size

    @model_validator(mode="after")
    def _cross_key_rules(self) -> ScenarioNode:
        check_node(self)
        return self

    def to_scenario(self, *, name: str, path: str, line: int) -> Scenario:
        """The runnable scenario: new tokens per request spelled out, defaults filled in."""
        rule = rule_for(self.mode, self.backend)
        model = self.model
        brule = backend_rule(self.backend)
        if brule.mla or brule.has_mla_child(model):
            model = model.model_copy(
                update={
                    "kv_lora_rank": model.kv_lora_rank or MLA_KV_LORA_RANK,
                    "qk_rope_head_dim": model.qk_rope_head_dim or MLA_ROPE_DIM,
                }
            )
        return Scenario(
            name=name,
            mode=self.mode,
            prefix_lens=self.batch.prefix_lens,
            extend_lens=new_token_counts(self),
            accept_lens=self.batch.accept_lens,
            mamba_track=self.batch.mamba_track,
            mamba_track_host=self.batch.mamba_track_host is not False,
            encoder_lens=self.batch.encoder_lens,
            items=self.batch.items,
            backend=None if self.probe else self.backend,
            probe=self.probe,
            capture_bs=tuple(sorted(set(self.cuda_graph.capture_bs))) if self.cuda_graph else None,
            full_prefill_max_req=self.cuda_graph.full_prefill_max_req if self.cuda_graph else None,
            breakable_prefill=bool(self.cuda_graph and self.cuda_graph.breakable),
            cpu_graph=bool(self.cuda_graph and self.cuda_graph.cpu),
            gpu_only=self.gpu_only,
            sync_free=self.sync_free
            if self.sync_free is not None
            else (
                self.gpu_only and not rule.host_reads and backend_rule(self.backend).sync_free and self.probe is None
            ),
            page_size=self.effective_page_size,
            model=model,
            spec=self.spec,
            seed=self.seed,
            tolerance=self.tolerance if self.tolerance is not None else DEFAULT_TOLERANCE[self.model.dtype],
            builder=self.builder,
            max_context_len=self.max_context_len,
            dcp_size=self.dcp_size,
            deterministic=self.deterministic,
            env=self.env,
            description=self.description,
            path=path,
            line=line,
        )


# ----------------------------------------------------------------------------- what runs


class Scenario(StrictModel):
    """A concrete batch to replay through a backend: every length spelled out per request."""

    name: Name
    mode: Mode
    prefix_lens: PrefixList
    extend_lens: NewTokenList
    accept_lens: AcceptList | None = None
    mamba_track: TrackList | None = None  # None: no Mamba state tracked
    mamba_track_host: Flag = True
    encoder_lens: NewTokenList | None = None  # None: a decoder-only model
    items: ItemsList | None = None  # None: no multi-item scoring
    # Exactly one of backend and probe (a probe scenario has no backend).
    backend: Backend | None = "triton"
    probe: ProbeName | None = None
    capture_bs: CaptureList | None = None  # None: eager, no CUDA graph; EXTEND: token buckets
    full_prefill_max_req: BatchSize | None = None  # EXTEND graphs: the request slots captured
    breakable_prefill: Flag = False  # EXTEND graphs: sglang's breakable prefill backend, not full
    cpu_graph: Flag = False  # DECODE graphs: sglang's CPU graph runner over IntelAMXAttnBackend
    gpu_only: Flag = False
    # Declared free of device->host syncs; defaults to gpu_only, except spec-v1 DRAFT_EXTEND,
    # whose accept lengths are read on the host by design; "cuda": judged on CUDA only.
    sync_free: SyncFree = False
    page_size: PageSize = 1
    model: ModelShape = ModelShape()
    spec: SpecShape = SpecShape()
    seed: Seed = 0
    tolerance: Tolerance = 1e-2
    builder: Builder = "kit"
    max_context_len: ContextLen | None = None
    dcp_size: DcpSize = 1
    deterministic: Flag = False
    env: EnvMap | None = None
    description: Text = ""
    path: str = ""
    line: int = 0

    @model_validator(mode="after")
    def _lengths_agree(self) -> Scenario:
        if (self.backend is None) == (self.probe is None):
            raise ValueError(
                f"names {'both a backend and a probe' if self.probe else 'neither a backend nor a probe'}; "
                f"give exactly one"
            )
        bs = len(self.prefix_lens)
        if len(self.extend_lens) != bs:
            raise ValueError(f"extend_lens has {len(self.extend_lens)} items for {bs} requests")
        if self.accept_lens is not None and len(self.accept_lens) != bs:
            raise ValueError(f"accept_lens has {len(self.accept_lens)} items for {bs} requests")
        if self.mamba_track is not None and len(self.mamba_track) != bs:
            raise ValueError(f"mamba_track has {len(self.mamba_track)} items for {bs} requests")
        if self.encoder_lens is not None and len(self.encoder_lens) != bs:
            raise ValueError(f"encoder_lens has {len(self.encoder_lens)} items for {bs} requests")
        if self.items is not None and len(self.items) != bs:
            raise ValueError(f"items has {len(self.items)} entries for {bs} requests")
        if self.capture_bs is not None:
            if list(self.capture_bs) != sorted(set(self.capture_bs)):
                raise ValueError(f"capture_bs must be sorted and distinct, got {list(self.capture_bs)}")
            if self.capture_bs[-1] < self._graph_load:
                what = f"{self._graph_load} new tokens" if self.mode == "EXTEND" else f"{bs}"
                raise ValueError(f"a batch of {what} fits no captured size {list(self.capture_bs)}")
            if self.full_prefill_max_req is not None and self.full_prefill_max_req < bs:
                raise ValueError(f"a batch of {bs} requests fits no {self.full_prefill_max_req} captured request slots")
        return self

    @property
    def _graph_load(self) -> int:
        """What a captured size must hold: the batch's requests, an EXTEND's new tokens (sglang's
        prefill graphs are captured per token count)."""
        return sum(self.extend_lens) if self.mode == "EXTEND" else self.batch_size

    @property
    def batch_size(self) -> int:
        return len(self.prefix_lens)

    @property
    def cuda_graph(self) -> bool:
        return self.capture_bs is not None

    @property
    def padded(self) -> bool:
        """A graph replay pads the raw batch up to the smallest captured size that fits (an
        EXTEND: its tokens to the bucket, its requests to the slots)."""
        if self.mode == "EXTEND":
            return self.cuda_graph and (self.graph_tokens != sum(self.extend_lens) or self.graph_bs != self.batch_size)
        return self.cuda_graph and self.graph_bs != self.batch_size

    @property
    def graph_bs(self) -> int | None:
        """The requests the replayed graph was captured with (an EXTEND: its request slots)."""
        if self.capture_bs is None:
            return None
        if self.mode == "EXTEND":
            # A breakable capture has no request slots: a replay hands the batch's own requests.
            return self.batch_size if self.breakable_prefill else self.full_prefill_max_req
        return min(b for b in self.capture_bs if b >= self.batch_size)

    @property
    def graph_tokens(self) -> int | None:
        """An EXTEND graph's token bucket: the smallest captured one that holds the new tokens."""
        if self.capture_bs is None or self.mode != "EXTEND":
            return None
        return min(b for b in self.capture_bs if b >= self._graph_load)

    def to_json(self) -> dict:
        """Plain JSON data; ``Scenario.from_json`` rebuilds an equal scenario from it."""
        return self.model_dump(mode="json")

    @classmethod
    def from_json(cls, data: Any) -> Scenario:
        """The scenario ``to_json`` wrote (a worker rebuilds its scenarios this way)."""
        name = data.get("name") if isinstance(data, dict) else None
        return validate_node(
            cls, data, where="<scenario JSON>", what=f"scenario {name}" if isinstance(name, str) else "scenario"
        )


# What a field's type is built of, by what each validator enforces: ``sglfix search`` reads a
# field's bounds and choices off these (sglfix.search.schema_types) instead of restating them.
VALIDATOR_KINDS: dict[Any, str] = {
    _integer: "integer",
    _choice: "choice",
    _per_request: "per_request",
    _flag: "flag",
    _power_of_two: "power_of_two",
}
