"""What a cell's fingerprint digests (``sglfix.harness.fingerprint``): the metadata as far as the
kernels read it, and, for a probe, the object graph the engine code built."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sglfix.harness.fingerprint import Fingerprint, fingerprinting, observe
from sglfix.harness.invariants import MetadataFields

READS = MetadataFields(indptr=("kv_indptr",), lengths=("seq_lens",), indices={"kv_indices": "kv_indptr"})


def _digest(view: SimpleNamespace, *, rows: int = 2, reads: MetadataFields | None = READS) -> str:
    fp = Fingerprint()
    fp.add_views([("eager", view, rows)], reads=reads)
    return fp.to_json()["metadata"]


def _view(**changes: object) -> SimpleNamespace:
    base = dict(
        kv_indptr=torch.tensor([0, 3, 5, 9], dtype=torch.int32),  # a third row the batch does not have
        kv_indices=torch.tensor([7, 8, 9, 1, 2, 0, 0], dtype=torch.int32),
        seq_lens=torch.tensor([3, 2, 4]),
        max_extend_len=4,
    )
    return SimpleNamespace(**{**base, **changes})


def test_what_no_kernel_reads_digests_the_same():
    same = _digest(_view())
    # A slice one entry longer, a buffer's slack, a row past the batch: never read.
    assert _digest(_view(kv_indptr=torch.tensor([0, 3, 5, 11, 12], dtype=torch.int32))) == same
    assert _digest(_view(kv_indices=torch.tensor([7, 8, 9, 1, 2, 5, 5, 5], dtype=torch.int32))) == same
    assert _digest(_view(seq_lens=torch.tensor([3, 2, 9]))) == same


def test_what_a_kernel_reads_digests_otherwise():
    same = _digest(_view())
    assert _digest(_view(kv_indptr=torch.tensor([0, 3, 4, 9], dtype=torch.int32))) != same
    assert _digest(_view(kv_indptr=torch.tensor([0, 3], dtype=torch.int32))) != same  # a row short
    assert _digest(_view(kv_indices=torch.tensor([7, 8, 9, 1, 3, 0, 0], dtype=torch.int32))) != same
    assert _digest(_view(seq_lens=torch.tensor([3, 1, 4]))) != same
    assert _digest(_view(max_extend_len=5)) != same
    # Without declared read extents every byte counts.
    assert _digest(_view(seq_lens=torch.tensor([3, 2, 9])), reads=None) != _digest(_view(), reads=None)


def test_an_indptr_past_its_buffer_is_digested_to_the_buffer_end():
    view = _view(kv_indptr=torch.tensor([0, 3, 40], dtype=torch.int32))
    assert _digest(view) != _digest(_view())


def test_a_probe_digests_the_object_graph_it_observes():
    def digest(obj: object) -> str | None:
        with fingerprinting() as fp:
            observe("probe", obj)
        return fp.to_json()["metadata"]

    class Backend:
        def __init__(self, lens: list[int], *, ptrs: int = 1) -> None:
            self.metadata = SimpleNamespace(lens=torch.tensor(lens), plan={"rows": len(lens)})
            self._plan = [torch.tensor(lens) * 2]
            self.data_ptrs = torch.tensor([ptrs], dtype=torch.uint64)  # differs in every process
            self.slack = torch.zeros(2 << 20, dtype=torch.float32)  # bulk data: shape only
            self.runner = type("MockModelRunner", (), {})()

    assert digest(Backend([3, 4])) == digest(Backend([3, 4], ptrs=99))
    assert digest(Backend([3, 4])) != digest(Backend([3, 5]))
    with fingerprinting() as fp:
        pass
    assert fp.to_json()["metadata"] is None  # observed nothing: no evidence, never "the same"
    observe("outside a fingerprinted cell", Backend([1]))  # a no-op


SCRATCH = MetadataFields(
    indptr=("kv_indptr", "mask_indptr"),
    indices={"kv_indices": "kv_indptr"},
    scratch=("attn_logits",),
    read_to={"custom_mask": "mask_indptr"},
)


def _scratch_view(**changes: object) -> SimpleNamespace:
    base = dict(
        kv_indptr=torch.tensor([0, 3, 5], dtype=torch.int32),
        kv_indices=torch.tensor([7, 8, 9, 1, 2], dtype=torch.int32),
        attn_logits=torch.zeros(2, 4, 8, 64),
        mask_indptr=torch.tensor([0, 4, 6], dtype=torch.int32),
        custom_mask=torch.tensor([1, 0, 1, 1, 0, 1, 1, 1], dtype=torch.uint8),
        lean_Mp=torch.zeros(16, 16),
    )
    return SimpleNamespace(**{**base, **changes})


def test_a_scratch_buffer_digests_by_dtype_and_row_width_only():
    same = _digest(_scratch_view(), reads=SCRATCH)
    # More rows, heads or splits than a launch uses, other contents: the kernels write it first.
    assert _digest(_scratch_view(attn_logits=torch.ones(3, 5, 9, 64)), reads=SCRATCH) == same
    # Another row width, dtype or rank is another layout for the kernel.
    assert _digest(_scratch_view(attn_logits=torch.zeros(2, 4, 8, 65)), reads=SCRATCH) != same
    assert _digest(_scratch_view(attn_logits=torch.zeros(2, 4, 8, 64, dtype=torch.float16)), reads=SCRATCH) != same
    assert _digest(_scratch_view(attn_logits=None), reads=SCRATCH) != same


def test_a_mask_is_digested_as_far_as_its_indptr_reads_it():
    same = _digest(_scratch_view(), reads=SCRATCH)
    assert (
        _digest(_scratch_view(custom_mask=torch.tensor([1, 0, 1, 1, 0, 1, 0, 0], dtype=torch.uint8)), reads=SCRATCH)
        == same
    )
    assert (
        _digest(_scratch_view(custom_mask=torch.tensor([1, 0, 1, 1, 1, 1, 1, 1], dtype=torch.uint8)), reads=SCRATCH)
        != same
    )


def test_fields_declared_unread_after_the_run_leave_the_digest():
    def digest(view: SimpleNamespace, unread: dict[str, str]) -> dict:
        fp = Fingerprint()
        fp.add_views([("eager", view, 2)], reads=SCRATCH)
        fp.mark_unread(unread)
        return fp.to_json()

    why = {"lean_Mp": "no launch asked for the Lean kernel"}
    base = digest(_scratch_view(), why)
    assert base["unread"] == why
    assert digest(_scratch_view(lean_Mp=None), why)["metadata"] == base["metadata"]
    assert digest(_scratch_view(lean_Mp=torch.zeros(17, 16)), why)["metadata"] == base["metadata"]
    # Read (not declared unread): the same change is a change.
    assert digest(_scratch_view(lean_Mp=None), {})["metadata"] != digest(_scratch_view(), {})["metadata"]
    # A field that is read is never hidden by another's declaration.
    assert digest(_scratch_view(kv_indices=torch.tensor([7, 8, 9, 1, 3])), why)["metadata"] != base["metadata"]


def test_a_zero_dim_tensor_digests_by_its_value():
    zero = SimpleNamespace(max_len=torch.tensor(4, dtype=torch.int32))
    assert _digest(zero, reads=None) == _digest(SimpleNamespace(max_len=torch.tensor(4, dtype=torch.int32)), reads=None)
    assert _digest(zero, reads=None) != _digest(SimpleNamespace(max_len=torch.tensor(5, dtype=torch.int32)), reads=None)
    assert _digest(zero, reads=None) != _digest(
        SimpleNamespace(max_len=torch.tensor([4], dtype=torch.int32)), reads=None
    )


def test_each_field_has_its_own_digest_so_a_difference_says_where():
    def fields(view: SimpleNamespace) -> dict:
        fp = Fingerprint()
        fp.add_views([("eager", view, 2)], reads=READS)
        fp.add_views([("replay", view, 2)], reads=READS)
        return fp.to_json()["fields"]

    same = fields(_view())
    other = fields(_view(kv_indices=torch.tensor([7, 8, 9, 1, 3, 0, 0], dtype=torch.int32)))
    assert sorted(k for k in same if same[k] != other[k]) == ["kv_indices"]
    # A probe's objects are named by their labels.
    with fingerprinting() as fp:
        observe("sizing", [1, 2])
    assert list(fp.to_json()["fields"]) == ["observed:sizing#0"]


def test_a_buffer_declared_unread_is_slack_in_every_view_of_it():
    def digest(size: int, *, declared: bool) -> str | None:
        mask = torch.zeros(size, dtype=torch.bool)
        holder = SimpleNamespace(mask=mask, view=mask[:4], lens=torch.tensor([3, 4]))
        with fingerprinting() as fp:
            observe("probe", holder, unread=[mask] if declared else [])
        return fp.to_json()["metadata"]

    assert digest(16, declared=True) == digest(20, declared=True)
    assert digest(16, declared=False) != digest(20, declared=False)


def _fi_wrapper(rows_bits: list[list[int]], *, gap: int) -> SimpleNamespace:
    """A FlashInfer prefill wrapper's planned buffers (page size 1): one query row per request over
    ``len(bits)`` keys, each request's bits packed (little bit order) from its own byte offset,
    ``gap`` unused bytes after each."""
    packed, offsets = [], []
    for bits in rows_bits:
        offsets.append(len(packed))
        for i in range(0, len(bits), 8):
            packed.append(sum(b << j for j, b in enumerate(bits[i : i + 8])))
        packed += [0xFF] * gap  # slack: never read
    kv = [0]
    for bits in rows_bits:
        kv.append(kv[-1] + len(bits))
    return SimpleNamespace(
        _custom_mask_buf=torch.tensor(packed, dtype=torch.uint8),
        _mask_indptr_buf=torch.tensor([*offsets, len(packed)], dtype=torch.int32),
        _qo_indptr_buf=torch.arange(len(rows_bits) + 1, dtype=torch.int32),
        _paged_kv_indptr_buf=torch.tensor(kv, dtype=torch.int32),
        _paged_kv_last_page_len_buf=torch.ones(len(rows_bits), dtype=torch.int32),
        _paged_kv_indices_buf=torch.arange(kv[-1], dtype=torch.int32),
    )


def test_a_flashinfer_mask_is_digested_as_its_rows_read_it_wherever_it_lies():
    """FlashInfer's mask_indptr only locates each row's bits: rows packed further apart digest the
    same, a bit a row reads flipped does not (sglfix.harness.adapters.sglang.flashinfer_dense)."""
    from sglfix.harness.adapters.sglang.flashinfer_dense import SglangFlashInferAdapter, _planned

    reads = SglangFlashInferAdapter.metadata_fields
    bits = [[1, 0, 1, 1, 0, 0, 1, 0, 1], [1, 1, 0]]

    def digest(wrapper: SimpleNamespace) -> str:
        return _digest(_planned(wrapper, rows=2, page_size=1), reads=reads)

    tight = digest(_fi_wrapper(bits, gap=0))
    assert digest(_fi_wrapper(bits, gap=3)) == tight
    assert digest(_fi_wrapper([[1, 0, 1, 1, 0, 0, 1, 0, 0], [1, 1, 0]], gap=0)) != tight
    assert digest(_fi_wrapper([bits[0], [1, 0, 0]], gap=3)) != tight
    # Offsets that reach past the buffer are no bits at all: named, and digested otherwise.
    short = _fi_wrapper(bits, gap=0)
    short._mask_indptr_buf[1] = 40
    assert "past" not in str(_planned(_fi_wrapper(bits, gap=0), rows=2, page_size=1).custom_mask)
    assert "reach byte" in _planned(short, rows=2, page_size=1).custom_mask
    assert digest(short) != tight


def test_the_flashinfer_dispatch_reads_its_dense_backends_fields():
    """The adapter a cell reaches (the dispatch, and the MLA one built on it) declares what the
    dense backend's views hold, the mask's offsets among them."""
    from sglfix.harness.adapters.sglang.flashinfer import FlashInferAdapter
    from sglfix.harness.adapters.sglang.flashinfer_dense import SglangFlashInferAdapter

    assert FlashInferAdapter.metadata_fields == SglangFlashInferAdapter.metadata_fields


def test_a_one_element_column_is_digested_by_its_value_whatever_its_stride():
    # A column of a [1, k] tensor: one element, stride k, which torch calls contiguous; the
    # draft's positions at batch size 1 are such a tensor.
    pairs = torch.tensor([[5, 6]], dtype=torch.int64)
    column = pairs[:, 1]
    assert column.stride() == (2,) and column.is_contiguous()
    with fingerprinting() as fp:
        observe("step", SimpleNamespace(positions=column))
    with fingerprinting() as same:
        observe("step", SimpleNamespace(positions=torch.tensor([6])))
    with fingerprinting() as other:
        observe("step", SimpleNamespace(positions=torch.tensor([5])))
    assert fp.to_json() == same.to_json() != other.to_json()
