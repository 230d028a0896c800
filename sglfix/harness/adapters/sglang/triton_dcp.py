"""Replays ``backend: triton`` scenarios with ``dcp_size`` > 1 (sglang's decode context parallelism)
through the installed sglang's own ``TritonAttnBackend``, one backend per rank in one process.

Under ``--dcp-size N`` each rank keeps the K/V of the positions ``p`` with ``p % N == rank``, at its
local slot ``loc // N`` of the request's slot ``loc`` (``TritonAttnBackend._set_kv_buffer``: the
write masked by position, at ``out_cache_loc // dcp_size``). Each rank's metadata must read exactly
those: its ``kv_indptr`` counts the positions it owns below the request's length, its
``kv_indices`` hold their local slots in position order, its split count covers them.

The forward is not run: a rank's decode gathers the queries of every rank and merges their partial
results through the DCP process group, which one process does not have. So each rank's metadata is
judged directly, after every init (eager, each capture and each replay, padded rows included)
against what the request rows written before any backend ran imply (``DcpTruth``); a graph's
metadata is read where the captured graph reads it (the captured ``ForwardMetadata``'s buffers).
The ranks are the backend's own ``get_parallel()`` reads, overridden while each rank's backend is
built (``attn_tp_size`` = ``attn_dcp_size`` = N as ``--dcp-size`` N over ``--tp-size`` N publishes
them, and that rank's ``attn_dcp_rank``).

Modes: DECODE (eager, and CUDA graph capture / padded replay through the kit's ``GraphRunner``
with its layer forward left out) and EXTEND (eager: a prefill reads its cached prefix per rank).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sglfix.harness.adapters.base import AdapterBase, MetadataHook, Prepared
from sglfix.harness.adapters.sglang.case import build_case
from sglfix.harness.adapters.sglang.guards import PERSISTENT, guard_buffers, guarded, watch_metadata
from sglfix.harness.adapters.sglang.truth import first_difference, host_ints
from sglfix.harness.kits import kit as _kit
from sglfix.harness.unavailable import NoOutput, Unavailable

__all__ = ["DcpTruth", "TritonDCPAdapter"]

_NO_GROUP = (
    "a decode context-parallel forward gathers every rank's queries and merges their partial "
    "results over the DCP process group, which one process has not; judged on each rank's metadata"
)


@dataclass
class DcpTruth:
    """The request rows as the case wrote them (before any backend ran) and the width: what each
    rank must read of a row, from the row and a length alone."""

    rows: Any  # req_to_token on the host, as written at build
    size: int

    def owned(self, *, row: int, length: int, rank: int, start: int = 0) -> list[int]:
        """Rank ``rank``'s local slots of row ``row``'s positions ``[start, start + length)``."""
        table = self.rows[row]
        first = start + (rank - start) % self.size
        return [int(table[p]) // self.size for p in range(first, start + length, self.size)]


@dataclass
class DcpCase:
    """A case built through sglang (``case``), the truth of its rows and, once made, one backend
    per rank and (graph scenarios) each rank's graph runner."""

    case: Any
    truth: DcpTruth
    ranks: list[_Rank] = field(default_factory=list)
    runners: list[Any] = field(default_factory=list)


@dataclass
class _Rank:
    rank: int
    backend: Any
    findings: list[tuple[str, str]] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)


class TritonDCPAdapter(AdapterBase):
    name = "triton"
    registry_name = "triton"

    def __init__(self, metadata_fields: Any) -> None:
        self.metadata_fields = metadata_fields

    def build(self, scenario: Any, *, device: str) -> Prepared:
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        if not hasattr(TritonAttnBackend, "_dcp_kv_indices"):
            raise Unavailable("this release's TritonAttnBackend has no decode context parallelism (no _dcp_kv_indices)")
        case = build_case(scenario=scenario, device=device)
        rows = case.runner.req_to_token_pool.req_to_token.to("cpu").tolist()
        dcp = DcpCase(case=case, truth=DcpTruth(rows=rows, size=scenario.dcp_size))
        # Each rank's pool holds 1/N of the slots: a local slot lies below that.
        return Prepared(case=dcp, num_slots=case.num_slots // scenario.dcp_size)

    def make_backend(self, prepared: Prepared) -> Any:
        """One TritonAttnBackend per rank, each built under its rank's parallel widths; rank 0's
        is the cell's backend, the others ride on the case."""
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
        from sglang.srt.runtime_context import get_parallel

        dcp, n = prepared.case, prepared.case.truth.size
        for rank in range(n):
            with get_parallel().override(**_rank_widths(n, rank)):
                backend = ATTENTION_BACKENDS[self.registry_name](dcp.case.runner)
            # A release without decode context parallelism takes no dcp size. Its rank is not read
            # here: the backend's own metadata code reads it, and a backend built without it (or
            # with another rank's) fails there, the code's fault, or is judged wrong by the rank judge.
            if getattr(backend, "dcp_size", None) != n:
                raise Unavailable(f"this release's TritonAttnBackend did not take dcp size {n} (rank {rank})")
            guard_buffers(backend, PERSISTENT)
            backend._sglfix_rank = _Rank(rank=rank, backend=backend)
            dcp.ranks.append(backend._sglfix_rank)
        dcp.case.runner.attn_backend = dcp.ranks[0].backend
        return dcp.ranks[0].backend

    def capture(self, prepared: Prepared, backend: Any, *, scenario: Any, on_metadata: MetadataHook) -> Any:
        """Per rank: the judge's hooks, then (graph scenarios) a graph runner captured at the
        scenario's sizes."""
        dcp = prepared.case
        for r in dcp.ranks:
            watch_metadata(r.backend, self._judging(dcp, r, on_metadata))
        if not scenario.capture_bs:
            return None
        graphs = _kit("graphs")
        for r in dcp.ranks:
            runner = _metadata_only_runner(
                case=dcp.case,
                backend=r.backend,
                capture_bs=list(scenario.capture_bs),
                guard=lambda b: guard_buffers(b, tuple(graphs.GRAPH_STATE)),
                record=False,
            ).capture()
            r.backend._sglfix_graph = runner
            dcp.runners.append(runner)
        return dcp.runners[0]

    def run(self, prepared: Prepared, backend: Any, runner: Any, *, scenario: Any, on_metadata: MetadataHook) -> Any:
        dcp = prepared.case
        case, batch = dcp.case, dcp.case.forward_batch
        for i, r in enumerate(dcp.ranks):
            if runner is None:
                _kit("attention").init_then_join(
                    r.backend, batch, None, lambda b=r.backend: b.init_forward_metadata(batch)
                )
                continue
            graph = dcp.runners[i]
            if not graph.can_run_graph(batch):
                raise Unavailable(f"no captured size fits a batch of {batch.batch_size}")
            graph.replay(batch, q=case.q, k=case.k, v=case.v)
        return NoOutput(_NO_GROUP)

    def _judging(self, dcp: DcpCase, r: _Rank, on_metadata: MetadataHook) -> MetadataHook:
        """The cell's invariant hook (labelled with the rank), then this rank's metadata against
        the rows it owns."""

        def hook(backend: Any, forward_batch: Any, phase: str) -> None:
            label = f"{phase} dcp rank {r.rank}"
            on_metadata(backend, forward_batch, label)
            metadata = backend.forward_metadata
            graph = getattr(backend, "_sglfix_graph", None)
            if phase == "replay" and graph is not None:
                # What the replayed graph reads: the metadata its capture built, at its addresses.
                metadata = graph.captured[int(forward_batch.batch_size)].metadata
            _judge_rank(dcp, r, metadata=metadata, batch=forward_batch, label=label)

        return hook

    def static_buffers(self, backend: Any) -> list:
        return guarded(backend)

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        return [("", backend.forward_metadata, int(forward_batch.batch_size))]

    def check_metadata(self, prepared: Prepared, backend: Any) -> list[tuple[str, str]]:
        from sglfix.harness.guards import describe_guards, guard_zones
        from sglfix.harness.hostcopy import to_host

        out: list[tuple[str, str]] = []
        for r in prepared.case.ranks:
            out += r.findings
            if r.rank:
                # Rank 0's zones are the cell's own (static_buffers); the other ranks' are read here.
                registry = guarded(r.backend)
                for message in describe_guards(registry, to_host(guard_zones(registry))):
                    out.append(("INVARIANT", f"dcp rank {r.rank}: write past a buffer's end: {message}"))
        if not any(verdict != "PASS" for verdict, _ in out):
            checked = sorted({c for r in prepared.case.ranks for c in r.checked})
            if checked:
                out.append(
                    (
                        "PASS",
                        f"every dcp rank's kv_indptr, kv_indices and splits read its own positions ({', '.join(checked)})",
                    )
                )
        return out

    def reference(self, prepared: Prepared) -> tuple[Any, Any]:
        raise AssertionError("a decode context-parallel cell has no output to compare")  # run returns NoOutput

    def unread_fields(self, prepared: Prepared, backend: Any) -> dict[str, str]:
        """Every field but the ones the rank judge reads: no kernel runs in this cell (the forward
        needs the DCP group), so whatever else the metadata holds is judged by the cells that run
        the forward, not here."""
        import dataclasses

        metadata = backend.forward_metadata
        if metadata is None or not dataclasses.is_dataclass(metadata):
            return {}
        judged = {*_READ, "num_kv_splits"}
        why = "no kernel runs in a decode context-parallel cell; its judge reads kv_indptr, kv_indices and splits"
        return {f.name: why for f in dataclasses.fields(metadata) if f.name not in judged}


def _rank_widths(n: int, rank: int) -> dict[str, int]:
    """What ``--tp-size n --dcp-size n`` publishes on rank ``rank``: attention TP over the same
    ranks as DCP (sglang's DCP splits the attention heads' KV by position across the TP group)."""
    from types import SimpleNamespace

    # The groups' handles as the rank sees them (the widths are checked against them); no
    # collective runs in a metadata init.
    group = SimpleNamespace(world_size=n, rank_in_group=rank)
    return dict(
        tp_size=n,
        attn_tp_size=n,
        moe_tp_size=n,
        tp_rank=rank,
        attn_tp_rank=rank,
        attn_dcp_size=n,
        attn_dcp_rank=rank,
        tp_group=group,
        attn_tp_group=group,
    )


def _lengths(batch: Any, mode: Any) -> tuple[list[int], str]:
    """Per row, the length each rank's indices cover: a decode's whole sequence, an extend's
    cached prefix (its new tokens are the forward's own K/V)."""
    if mode.is_decode_or_idle():
        return host_ints(batch.seq_lens), "seq_lens"
    return host_ints(batch.extend_prefix_lens), "extend_prefix_lens"


# What a rank's kernels read of its metadata, whatever the mode.
_READ = ("kv_indptr", "kv_indices")


def _judge_rank(dcp: DcpCase, r: _Rank, *, metadata: Any, batch: Any, label: str) -> None:
    truth = dcp.truth
    bs = int(batch.batch_size)
    rows = host_ints(batch.req_pool_indices, bs)
    lengths, what = _lengths(batch, batch.forward_mode)
    want = [truth.owned(row=row, length=n, rank=r.rank) for row, n in zip(rows, lengths[:bs])]
    where = f"{label}: "
    read = _READ + (("num_kv_splits",) if batch.forward_mode.is_decode_or_idle() else ())
    missing = "metadata" if metadata is None else next((f for f in read if getattr(metadata, f, None) is None), None)
    if missing is not None:
        r.findings.append(("INVARIANT", f"{where}the rank's {missing} is None after the init; its kernels read it"))
        return
    indptr = host_ints(metadata.kv_indptr, bs + 1)
    if len(indptr) < bs + 1 or indptr[0] != 0:
        r.findings.append(("INVARIANT", f"{where}kv_indptr {indptr} does not open {bs} rows at 0"))
        return
    indices = host_ints(metadata.kv_indices)
    if len(indices) < indptr[bs]:
        r.findings.append(
            (
                "INVARIANT",
                f"{where}kv_indices holds {len(indices)} entries on dcp rank {r.rank}, its kv_indptr reads "
                f"{indptr[bs]}: the rank's last rows are written and read past its end",
            )
        )
        return
    for b, slots in enumerate(want):
        got_n = indptr[b + 1] - indptr[b]
        if got_n != len(slots):
            r.findings.append(
                (
                    "INVARIANT",
                    f"{where}row {b} (request row {rows[b]}, {what} {lengths[b]}) has {got_n} kv entries on dcp "
                    f"rank {r.rank} of {truth.size}; the rank owns {len(slots)} of its positions",
                )
            )
            return
        got = indices[indptr[b] : indptr[b + 1]]
        i = first_difference(got, slots)
        if i is not None:
            pos = r.rank + i * truth.size
            r.findings.append(
                (
                    "INVARIANT",
                    f"{where}row {b} (request row {rows[b]}) reads local slot {got[i]} for position {pos} on dcp "
                    f"rank {r.rank} of {truth.size}; that position's K/V is at local slot {slots[i]}",
                )
            )
            return
    splits = metadata.num_kv_splits
    if splits is not None:
        top = int(r.backend.max_kv_splits)
        values = host_ints(splits, bs)
        bad = next((b for b, s in enumerate(values) if not 1 <= s <= top), None)
        if bad is not None:
            r.findings.append(
                (
                    "INVARIANT",
                    f"{where}row {bad} has {values[bad]} kv splits on dcp rank {r.rank}; the split-K decode "
                    f"takes 1 .. {top} (a rank that owns no position still runs one)",
                )
            )
            return
    r.checked.append(label.split(" dcp rank")[0])


def _metadata_only_runner(**kwargs: Any) -> Any:
    """The kit's ``GraphRunner`` (this version's capture and padded replay of the backend) with its
    layer forward left out: the captured body is the in-graph metadata step alone."""
    import torch

    class MetadataOnlyGraphRunner(_kit("graphs").GraphRunner):  # type: ignore[misc, name-defined]
        def _forward(self, captured: Any, bs: int) -> Any:
            self.backend.init_forward_metadata_in_graph(captured.batch)
            return torch.zeros((bs * self.width, 1))

    return MetadataOnlyGraphRunner(**kwargs)
