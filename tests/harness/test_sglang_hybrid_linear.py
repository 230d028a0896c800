"""Real sglang 0.5.23's HybridLinearAttnBackend (``sglang.hybrid_linear``: its Triton backend for the
full-attention layers, its GDN backend for the linear ones) on CPU through the CLI a user runs:
every built-in scenario passes with both judges named, and each judge fails when the code under
test is made wrong (a candidate fix that breaks it, applied with ``--apply``): a padded graph row
that reads a live state slot, one that exists only at capture, and an extend whose linear layers
split the tokens at the wrong offsets.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from real_sglang import breaking_patch, require_sglang, run_cli

_run = run_cli


def _breaking_patch(tmp_path: Path, old: str, new: str) -> Path:
    """The installed hybrid_linear_attn_backend.py with ``old`` (present once) made ``new``."""
    source = Path(require_sglang()) / "srt" / "layers" / "attention" / "hybrid_linear_attn_backend.py"
    assert source.read_text().count(old) == 1, f"hybrid_linear_attn_backend.py no longer has {old!r} once"
    return breaking_patch(tmp_path, "hybrid_linear_attn_backend", old, new)


def _patched_cells(tmp_path: Path, select: str, old: str, new: str) -> dict:
    """The cells of ``select`` run with the installed backend's ``old`` made ``new``, by scenario."""
    patch = _breaking_patch(tmp_path, old, new)
    cells = _run(tmp_path, "-s", select, "--apply", str(patch))["cells"]
    return {c["scenario"]: c for c in cells if c.get("toggles")}


def _linear_message(cell: dict) -> str:
    return next(f["message"] for f in cell["findings"] if "linear" in f["message"])


def test_every_hybrid_scenario_passes_with_both_judges(tmp_path):
    require_sglang()
    # Kimi-Linear's (sglang-hybrid-kda-*, -kimi-*) and a CPU device's graphs (-cpu-graph@*) have
    # their own files: their judges differ.
    cells = {c["scenario"]: c for c in _run(tmp_path, "-s", "sglang-hybrid-[!ck]*")["cells"]}
    assert len(cells) == 53, sorted(cells)
    failed = {n: (c["verdict"], c["findings"][:2]) for n, c in cells.items() if c["verdict"] != "PASS"}
    assert not failed, failed
    for name, c in cells.items():
        # The full-attention layer's output, through the hybrid's dispatch.
        assert c["error"]["rows"] > 0 and c["error"]["bad_rows"] == 0, (name, c["error"])
        # The linear layers' metadata of every init: capture and replay for graphs.
        inits = 2 if "cg=graph" in name else 1
        inits = 3 if name.endswith("-decode-sizes") else inits  # two sizes captured, one replayed
        tracked = {"extend": " and the prefill's Mamba track plan", "decode": " and the decode step's Mamba track"}
        tracked = next((t for k, t in tracked.items() if f"-{k}-track" in name), "")
        mamba2 = " and the Mamba2 metadata" if "-mamba2-" in name else ""
        mamba2 = " and the conv-state handle" if "-short-conv-" in name else mamba2
        mamba2 = " and the multi-item query segments and item branches" if "-mis-batch" in name else mamba2
        mamba2 = " and the ReplaySSM ring's cursors and flushes" if "-replayssm" in name else mamba2
        assert _linear_message(c) == (
            f"metadata reference: the linear layers' state slots and query offsets{tracked}{mamba2} of {inits} "
            "metadata init(s) are their batch's"
        ), (name, c["findings"])
        commits = [f["message"] for f in c["findings"] if f["message"].startswith("post-verify commit")]
        assert len(commits) == ("-verify-commit" in name), (name, c["findings"])
        if commits:
            # A PLE model's side states are judged beside its linear states.
            side = ", short-conv side state, N-gram context" if "-ple" in name else ""
            assert f"conv window (conv state 0){side}, and no other slot changed" in commits[0], commits


def test_a_padded_row_reading_a_live_state_slot_is_seen(tmp_path):
    """The padded row of a replayed graph keeps request row 0's slot instead of -1: the captured
    kernels would update a live request's state. The full-attention output cannot show it."""
    require_sglang()
    patch = _breaking_patch(tmp_path, "mamba_indices[bs - num_padding :] = -1", "pass")
    cells = _run(tmp_path, "-s", "sglang-hybrid-decode@*", "--apply", str(patch))["cells"]
    patched = {c["scenario"]: c for c in cells if c.get("toggles")}
    cell = patched["sglang-hybrid-decode@cg=graph-padded"]
    assert cell["verdict"] == "DIVERGE", cell["findings"]
    assert cell["error"]["bad_rows"] == 0
    assert _linear_message(cell).startswith("metadata reference: linear metadata init 2 of 2: padded rows 3..3"), cell
    assert patched["sglang-hybrid-decode@cg=graph"]["verdict"] == "PASS"  # nothing padded there


def test_a_capture_only_fault_is_seen_though_replay_rebuilds_it(tmp_path):
    require_sglang()
    # The graph's metadata init at capture runs the replay code with in_capture set: its last
    # row marked padded there only.
    patch = _breaking_patch(
        tmp_path,
        "mamba_indices[bs - num_padding :] = -1",
        "mamba_indices[bs - num_padding - int(in_capture) :] = -1",
    )
    cells = _run(tmp_path, "-s", "sglang-hybrid-target-verify@cg=graph", "--apply", str(patch))["cells"]
    cell = next(c for c in cells if c.get("toggles"))
    assert cell["verdict"] == "DIVERGE", cell["findings"]
    assert cell["error"]["bad_rows"] == 0, "the replayed output alone does not show it"
    assert _linear_message(cell).startswith("metadata reference: linear metadata init 1 of 2: mamba_cache_indices"), (
        cell
    )


def test_an_extend_split_at_the_wrong_offsets_is_seen(tmp_path):
    require_sglang()
    patch = _breaking_patch(
        tmp_path,
        "query_start_loc[:bs] = forward_batch.extend_start_loc",
        "query_start_loc[:bs] = forward_batch.extend_start_loc + 1",
    )
    cells = _run(tmp_path, "-s", "sglang-hybrid-extend", "--apply", str(patch))["cells"]
    cell = next(c for c in cells if c.get("toggles"))
    assert cell["verdict"] == "DIVERGE", cell["findings"]
    assert "query_start_loc = [1, 6, 13, 21]" in _linear_message(cell), cell


def test_a_replay_that_rewrites_the_batchs_rows_is_judged_by_the_rows_it_was_handed(tmp_path):
    """The replay zeroes every request row, not only the padded ones, in the batch it was handed:
    every row then reads the padding slot. The judge compares with the rows as handed, not with
    the batch the code under test rewrote."""
    require_sglang()
    patch = _breaking_patch(tmp_path, "req_pool_indices[bs - num_padding :] = 0", "req_pool_indices[:] = 0")
    cells = _run(tmp_path, "-s", "sglang-hybrid-decode@cg=graph", "--apply", str(patch))["cells"]
    cell = next(c for c in cells if c.get("toggles"))
    assert cell["verdict"] == "DIVERGE", cell["findings"]
    assert _linear_message(cell).startswith("metadata reference: linear metadata init 2 of 2: mamba_cache_indices"), (
        cell
    )


def test_a_chain_verify_handed_tree_links_is_seen(tmp_path):
    require_sglang()
    patch = _breaking_patch(
        tmp_path, "if is_target_verify and self.topk > 1:", "if is_target_verify and self.topk > -1:"
    )
    cells = _run(tmp_path, "-s", "sglang-hybrid-target-verify@cg=graph", "--apply", str(patch))["cells"]
    cell = next(c for c in cells if c.get("toggles"))
    assert cell["verdict"] == "DIVERGE", cell["findings"]
    assert "retrieve_next_token is set for a chain verify" in _linear_message(cell), cell


def test_the_overlap_plan_fix_up_must_leave_the_replayed_tree_links_right(tmp_path):
    """Under the overlap plan stream the worker re-copies a tree verify's links into the replayed
    graph's buffers after the join (update_verify_buffers_to_fill_after_draft). A fix-up that puts
    the next-sibling links where the next-token ones go is seen in the graph cells that take it,
    naming the link, and not where the worker never calls it (no plan stream)."""
    require_sglang()
    patched = _patched_cells(
        tmp_path,
        "sglang-hybrid-target-verify-tree*",
        "self.retrieve_next_token_list[cuda_graph_bs - 1][:bs_without_pad].copy_(\n"
        "            spec_info.retrieve_next_token",
        "self.retrieve_next_token_list[cuda_graph_bs - 1][:bs_without_pad].copy_(\n"
        "            spec_info.retrieve_next_sibling",
    )
    assert len(patched) == 6, sorted(patched)
    for name, cell in patched.items():
        fixed_up = "-plan@" in name and "cg=graph" in name
        assert cell["verdict"] == ("DIVERGE" if fixed_up else "PASS"), (name, cell["findings"])
        if fixed_up:
            assert "retrieve_next_token[0] = " in _linear_message(cell), (name, cell["findings"])


def test_a_mamba2_scan_that_loses_a_requests_chunk_offset_is_seen(tmp_path):
    """Mamba2's chunked scan starts each request's first logical chunk at its offset in the
    physical chunk; one that starts them all at 0 would mix the requests' states. Seen on the
    prefill that has prefixes, naming the field; the decode and verify metadata never build it."""
    require_sglang()
    source = Path(require_sglang()) / "srt" / "layers" / "attention" / "mamba" / "mamba2_metadata.py"
    old = "chunk_offsets[_s] = s % chunk_size"
    assert source.read_text().count(old) == 1, f"mamba2_metadata.py no longer has {old!r} once"
    patch = breaking_patch(tmp_path, "mamba/mamba2_metadata", old, "chunk_offsets[_s] = 0")
    cells = _run(tmp_path, "-s", "sglang-hybrid-mamba2-*", "--apply", str(patch))["cells"]
    patched = {c["scenario"]: c for c in cells if c.get("toggles")}
    assert len(patched) == 7, sorted(patched)
    for name, cell in patched.items():
        if "-extend" in name:
            assert cell["verdict"] == "DIVERGE", cell["findings"]
            assert "Mamba2 chunk_offsets is " in _linear_message(cell), cell["findings"]
        else:
            assert cell["verdict"] in ("PASS", "NOT_REACHED"), (name, cell["verdict"])


def _short_conv_patch(tmp_path: Path, old: str, new: str) -> Path:
    source = Path(require_sglang()) / "srt" / "layers" / "attention" / "linear" / "short_conv_backend.py"
    assert source.read_text().count(old) == 1, f"short_conv_backend.py no longer has {old!r} once"
    return breaking_patch(tmp_path, "linear/short_conv_backend", old, new)


def test_a_short_conv_replay_that_hands_its_slots_out_afresh_is_seen(tmp_path):
    """The conv layers of a captured graph read the slots at the address the capture handed out;
    a step that always casts afresh leaves them reading the capture's slots on every replay. The
    slots' values are right, so only the address shows it, and only under a graph."""
    require_sglang()
    patch = _short_conv_patch(tmp_path, "elif buf is not None and idx.shape[0] <= buf.shape[0]:", "elif False:")
    cells = _run(tmp_path, "-s", "sglang-hybrid-short-conv-decode@*", "--apply", str(patch))["cells"]
    patched = {c["scenario"]: c for c in cells if c.get("toggles")}
    assert len(patched) == 3, sorted(patched)
    for name, cell in patched.items():
        if "cg=graph" in name:
            assert cell["verdict"] == "DIVERGE", (name, cell["findings"])
            assert "hands the slots out at another address than the first capture's" in _linear_message(cell)
        else:
            assert cell["verdict"] == "PASS", (name, cell["findings"])


def test_a_short_conv_prefill_that_loses_which_requests_resume_a_prefix_is_seen(tmp_path):
    """The host loop of a conv model starts a request from its cached state by the handle's
    has_prefix_cpu; one that says no request resumes one would restart them from zero."""
    require_sglang()
    old = "int(p) > 0 for p in forward_batch.extend_prefix_lens_cpu"
    patch = _short_conv_patch(tmp_path, old, "False for p in forward_batch.extend_prefix_lens_cpu")
    cells = _run(tmp_path, "-s", "sglang-hybrid-short-conv-*", "--apply", str(patch))["cells"]
    patched = {c["scenario"]: c for c in cells if c.get("toggles")}
    cell = patched["sglang-hybrid-short-conv-extend"]
    assert cell["verdict"] == "DIVERGE", cell["findings"]
    assert "has_prefix_cpu = [False, False, False], the prefixes [0, 37, 5] give [False, True, True]" in (
        _linear_message(cell)
    )


def test_a_track_plan_that_snapshots_the_wrong_chunk_state_is_seen(tmp_path):
    """The device-side plan (no host plan with the batch) takes each unaligned request's chunk
    state one chunk late: the prefix cache would hold a state 64 tokens past the boundary it
    names. Neither output nor the slot and offset checks can show it; the copy over marker
    states does, naming the request."""
    require_sglang()
    patched = _patched_cells(
        tmp_path,
        "sglang-hybrid-extend-track@*",
        "track_ssm_src_offset[mamba_track_mask][not_aligned] + (",
        "track_ssm_src_offset[mamba_track_mask][not_aligned] + 1 + (",
    )
    cell = patched["sglang-hybrid-extend-track@host=off"]
    assert cell["verdict"] == "DIVERGE", cell["findings"]
    assert cell["error"]["bad_rows"] == 0
    message = _linear_message(cell)
    assert "state copy from the chunk states leaves slot" in message and "request 0's destination" in message, message
    # The host plan is another code path: the same edit leaves it as it was.
    assert patched["sglang-hybrid-extend-track@host=on"]["verdict"] == "PASS"


def test_a_host_plan_that_selects_the_wrong_snapshot_rows_is_seen(tmp_path):
    """The host plan hands the aligned requests' rows where the kernel's snapshot rows of the
    unaligned ones belong: the copy from the kernel's own snapshot fills the destinations with
    other requests' states."""
    require_sglang()
    patch = _breaking_patch(tmp_path, "to_device(plan.unaligned_rows),", "to_device(plan.final_rows),")
    cells = _run(tmp_path, "-s", "sglang-hybrid-extend-track@host=on", "--apply", str(patch))["cells"]
    cell = next(c for c in cells if c.get("toggles"))
    assert cell["verdict"] == "DIVERGE", cell["findings"]
    assert "state copy from the kernel's snapshot" in _linear_message(cell), cell["findings"]


def test_a_replay_that_keeps_a_stale_track_destination_is_seen(tmp_path):
    """The replay refreshes its track buffer one row short: the last tracked request's decode
    snapshot goes to whatever destination an earlier replay left there. Eagerly nothing is wrong;
    the graph cells show it, naming the destinations."""
    require_sglang()
    patched = _patched_cells(
        tmp_path,
        "sglang-hybrid-decode-track@*",
        "track_buf.copy_(self._translate_mamba_indices(mamba_track_indices[:bs]))",
        "track_buf[: bs - 1].copy_(self._translate_mamba_indices(mamba_track_indices[: bs - 1]))",
    )
    assert patched["sglang-hybrid-decode-track@cg=eager"]["verdict"] == "PASS"
    cell = patched["sglang-hybrid-decode-track@cg=graph"]
    assert cell["verdict"] == "DIVERGE", cell["findings"]
    assert cell["error"]["bad_rows"] == 0, "the full-attention output cannot show it"
    assert "mamba_track_indices = [" in _linear_message(cell), cell["findings"]


# Multi-item scoring on a hybrid model: GDN's query segments and item branches (mis_metadata),
# the full-attention layers over FlashInfer.


def test_a_hybrid_scores_items_with_flashinfers_mask_and_gdns_branches(tmp_path):
    """Both judges of a scored batch name what they checked: FlashInfer's item plan and GDN's
    segments; a generate batch under --enable-mis builds no segments."""
    require_sglang()
    cells = {c["scenario"]: c for c in _run(tmp_path, "-s", "sglang-hybrid-mis-*")["cells"]}
    scored, plain = cells["sglang-hybrid-mis-batch"], cells["sglang-hybrid-mis-unscored"]
    assert scored["verdict"] == plain["verdict"] == "PASS", (scored["findings"], plain["findings"])
    messages = [f["message"] for f in scored["findings"]]
    assert any("each request's max_item_len in the plan" in m for m in messages), messages
    assert "the multi-item query segments and item branches" in _linear_message(scored)
    assert "multi-item" not in _linear_message(plain)


def test_an_item_branch_without_its_delimiter_is_seen(tmp_path):
    """Each branch starts at its delimiter (the recurrence resumes from the query's state there);
    one that starts a token late drops the delimiter from every branch, so the segments are short."""
    require_sglang()
    old = "range(request_start + branch_start, request_start + branch_end)"
    patch = breaking_patch(tmp_path, "linear/gdn_backend", old, old.replace("+ branch_start,", "+ branch_start + 1,"))
    cells = _run(tmp_path, "-s", "sglang-hybrid-mis-*", "--apply", str(patch))["cells"]
    patched = {c["scenario"]: c for c in cells if c.get("toggles")}
    cell = patched["sglang-hybrid-mis-batch"]
    assert cell["verdict"] == "DIVERGE", cell["findings"]
    assert "item_token_indices = [" in _linear_message(cell), cell["findings"]
    # The full-attention output cannot show it: only the linear layers read the branches.
    assert cell["error"]["bad_rows"] == 0, cell["error"]
    assert patched["sglang-hybrid-mis-unscored"]["verdict"] in ("PASS", "NOT_REACHED")


def test_segments_that_lose_their_dtype_are_seen(tmp_path):
    """The branch offsets are int32 for the kernels; a build that hands int64 is caught."""
    require_sglang()
    old = "result = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=device)"
    patch = breaking_patch(tmp_path, "linear/gdn_backend", old, old.replace("int32", "int64"))
    cells = _run(tmp_path, "-s", "sglang-hybrid-mis-batch", "--apply", str(patch))["cells"]
    cell = next(c for c in cells if c.get("toggles"))
    assert cell["verdict"] == "DIVERGE", cell["findings"]
    assert "query_cu_seqlens is torch.int64, its kernels read torch.int32" in _linear_message(cell)


# The worker's commit after a verify: update_mamba_state_after_mtp_verify.


def test_a_commit_of_the_step_before_the_last_accepted_one_is_seen(tmp_path):
    """Each request's slot must take the state after its last accepted step; one step short is a
    state that misses the last accepted token (and a request that accepted nothing keeps its
    state), eagerly and after a replay."""
    require_sglang()
    old = "            mamba_caches,\n            state_indices_tensor,\n            last_correct_step_indices,\n"
    patched = _patched_cells(
        tmp_path,
        "sglang-hybrid-verify-commit@*",
        old,
        old.replace("last_correct_step_indices,", "last_correct_step_indices - 1,"),
    )
    assert len(patched) == 3, sorted(patched)
    for name, cell in patched.items():
        assert cell["verdict"] == "DIVERGE", (name, cell["findings"])
        message = next(f["message"] for f in cell["findings"] if f["verdict"] == "DIVERGE")
        assert message.startswith("post-verify commit: request 0's state slot "), message
        assert "holds row 0's step 1 for its SSM state, its last accepted step is 2" in message, message


def test_a_commit_into_the_request_rows_instead_of_the_state_slots_is_seen(tmp_path):
    """The commit writes each request's state slot (the pool's mapping of its row); writing the row
    numbers instead leaves the requests' slots stale and overwrites other slots."""
    require_sglang()
    old = "self.linear_attn_backend.forward_metadata.mamba_cache_indices[\n                    :request_number\n                ]"
    patched = _patched_cells(tmp_path, "sglang-hybrid-verify-commit-tree@*", old, "req_pool_indices[:request_number]")
    assert len(patched) == 3, sorted(patched)
    for name, cell in patched.items():
        assert cell["verdict"] == "DIVERGE", (name, cell["findings"])
        assert any("post-verify commit: " in f["message"] for f in cell["findings"]), cell["findings"]


def test_a_pipeline_parallel_commit_that_reads_the_batch_rows_is_seen(tmp_path):
    """Under SGLANG_ENABLE_PP_SPEC the verify keeps each request's step states at its request row;
    a commit that reads them at the batch rows commits another request's states (or untouched
    rows'), and only the stable-rows scenario can tell."""
    require_sglang()
    old = "src_indices_raw = req_pool_indices[:request_number]"
    patched = _patched_cells(tmp_path, "sglang-hybrid-verify-commit*", old, "src_indices_raw = None")
    assert len(patched) == 15, sorted(patched)
    for name, cell in patched.items():
        if "-pp@" in name:
            assert cell["verdict"] == "DIVERGE", (name, cell["findings"])
            assert any(f["message"].startswith("post-verify commit: ") for f in cell["findings"]), cell["findings"]
        else:
            assert cell["verdict"] in ("PASS", "NOT_REACHED"), (name, cell["verdict"])


@pytest.mark.parametrize(
    "old, new, needle",
    [
        # The side states committed one step short: the linear states are right, the side states not.
        (
            "                state_indices_tensor,\n                last_correct_step_indices,\n                src_indices_raw,\n",
            "                state_indices_tensor,\n                last_correct_step_indices - 1,\n                src_indices_raw,\n",
            "for its short-conv side state",
        ),
        # The N-gram context left out of the commit: each request keeps its old context.
        (
            "ngram_pool.intermediate_context is not None",
            "ngram_pool.intermediate_context is None",
            "kept its state (nothing committed) for its N-gram context",
        ),
    ],
    ids=["side-states-one-step-short", "ngram-context-left-out"],
)
def test_a_commit_that_rolls_the_ple_side_states_wrong_is_seen(tmp_path, old, new, needle):
    """A PLE model's side states are committed beside its linear states, by their own scatter; a
    fault there leaves the linear states right, and only the PLE scenarios can tell."""
    require_sglang()
    patched = _patched_cells(tmp_path, "sglang-hybrid-verify-commit*", old, new)
    assert len(patched) == 15, sorted(patched)
    for name, cell in patched.items():
        if "-ple" not in name:
            assert cell["verdict"] == "PASS", (name, cell["verdict"], cell["findings"][:2])
            continue
        assert cell["verdict"] == "DIVERGE", (name, cell["findings"])
        message = next(f["message"] for f in cell["findings"] if f["verdict"] == "DIVERGE")
        assert message.startswith("post-verify commit: request ") and needle in message, message


@pytest.mark.parametrize(
    "old, new, where, needle",
    [
        # The eager step advances each cursor by two: its slots' next steps land on the wrong entry.
        (
            "(replayssm_write_pos + 1) % L",
            "(replayssm_write_pos + 2) % L",
            "cg=eager",
            "has ReplaySSM cursor",
        ),
        # A replay advances each cursor by two (the eager step is right).
        ("(cur_pos + 1) % L", "(cur_pos + 2) % L", "cg=graph", "has ReplaySSM cursor"),
        # The flush one step past the radix track's boundary: the ring and the track drift apart.
        (
            "mask = (seq_lens_cpu[:bs].to(torch.int64) % interval) == 0",
            "mask = (seq_lens_cpu[:bs].to(torch.int64) % interval) == 1",
            "",
            "row 0 (seq_lens 16) is handed force_flush 0; the radix track interval 8 makes it 1",
        ),
    ],
    ids=["eager-advance", "replay-advance", "flush-off-the-boundary"],
)
def test_a_replayssm_ring_stepped_wrong_is_seen(tmp_path, old, new, where, needle):
    """Each decode step snapshots a slot's ring cursor, flags a flush on the radix track boundary and
    advances the cursor; a wrong step is seen in the cells that take it, eager or replayed."""
    require_sglang()
    patched = _patched_cells(tmp_path, "sglang-hybrid-decode-replayssm@*", old, new)
    assert len(patched) == 3, sorted(patched)
    for name, cell in patched.items():
        if where not in name:
            assert cell["verdict"] == "PASS", (name, cell["findings"][:2])
            continue
        assert cell["verdict"] == "DIVERGE", (name, cell["findings"][:2])
        assert needle in _linear_message(cell), _linear_message(cell)


def test_a_capture_that_hands_the_graph_another_link_buffer_is_seen_at_replay(tmp_path):
    """A tree verify's capture that hands its kernels another size's link buffer: every replay
    refills its own size's buffer, which the graph never reads. The replay's metadata is right;
    only the address the capture handed out shows it."""
    require_sglang()
    old = "retrieve_next_token=self.retrieve_next_token_list[bs - 1],"
    new = "retrieve_next_token=self.retrieve_next_token_list[(bs - 2) if in_capture else bs - 1],"
    patch = breaking_patch(tmp_path, "hybrid_linear_attn_backend", old, new, occurrence=2)
    cells = _run(tmp_path, "-s", "sglang-hybrid-target-verify-tree@*", "--apply", str(patch))["cells"]
    patched = {c["scenario"]: c for c in cells if c.get("toggles")}
    assert len(patched) == 3, sorted(patched)
    for name, cell in patched.items():
        if "cg=graph" in name:
            assert cell["verdict"] == "DIVERGE", (name, cell["findings"])
            assert "hands retrieve_next_token at another address than its capture did" in _linear_message(cell)
        else:
            assert cell["verdict"] in ("PASS", "NOT_REACHED"), (name, cell["verdict"])


def test_a_replay_reads_its_own_sizes_metadata_whichever_size_was_captured_last(tmp_path):
    # The runner captures the largest size first, so a bucket of 1 is captured last; a batch of 2
    # replays the bucket of 4. A captured graph holds its own size's views: the hybrid's full
    # backend must hand the replay the metadata of 4, not the last capture's (the decode kernel's
    # assert on q rows against kv_indptr, in a search's scenario, before the kit put it back).
    require_sglang()
    path = tmp_path / "buckets.yaml"
    path.write_text(
        "scenarios:\n"
        "  - name: hybrid-decode-buckets\n"
        "    backend: hybrid_linear\n"
        "    mode: DECODE\n"
        "    batch: {prefix_lens: [13, 37], mamba_track: [1, 0]}\n"
        "    model: {num_heads: 2, num_kv_heads: 2, head_dim: 64, dtype: bfloat16}\n"
        "    cuda_graph: {capture_bs: [1, 4]}\n"
    )
    (cell,) = _run(tmp_path, "--scenario-file", str(path))["cells"]
    assert cell["verdict"] == "PASS", cell["findings"][:2]
    assert _linear_message(cell).endswith("of 3 metadata init(s) are their batch's"), cell["findings"]
