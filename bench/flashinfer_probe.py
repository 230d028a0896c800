"""Check, on the GPU, the FlashInfer calls the FlashInfer backends rely on, and warm the JIT cache.

Each check compares against a float32 torch computation of the same metadata:
- MLA paged wrapper, eager plan/run, one query per sequence (draft decode) and causal multi-row
  queries over a block table with pages of 32 (the trtllm_mla stand-in);
- MLA wrapper in CUDA-graph mode: capture, change kv_indices on the device and re-plan on the host
  through ``_cached_module.plan`` (upstream's fast plan), replay;
- GQA decode wrapper, eager and in CUDA-graph mode.
Prints one line per check and writes JSON (--json).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
from relpaths import relativize


def mla_ref(q_nope, q_pe, ckv, kpe, qo_indptr, kv_indptr, kv_indices, kv_len, page_size, causal, scale):
    outs = []
    for b in range(len(kv_len)):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        pages = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        slots = (pages[:, None] * page_size + torch.arange(page_size, device=pages.device)).reshape(-1)[
            : int(kv_len[b])
        ]
        k = torch.cat([ckv.reshape(-1, ckv.shape[-1])[slots], kpe.reshape(-1, kpe.shape[-1])[slots]], -1).float()
        q = torch.cat([q_nope[q0:q1], q_pe[q0:q1]], -1).float()
        s = torch.einsum("qhd,kd->hqk", q, k) * scale
        if causal:
            n, L = q1 - q0, int(kv_len[b])
            mask = torch.arange(L, device=q.device)[None, :] < (L - n + torch.arange(n, device=q.device)[:, None] + 1)
            s = s.masked_fill(~mask[None], float("-inf"))
        outs.append(torch.einsum("hqk,kd->qhd", s.softmax(-1), k[:, : ckv.shape[-1]]))
    return torch.cat(outs)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    import flashinfer

    dev = torch.device("cuda")
    results = []

    def record(name, err, t0, tol):
        results.append({"check": name, "max_abs_err": err, "ok": err < tol, "seconds": round(time.time() - t0, 1)})
        print(f"{name:<44} err {err:.3g} {'ok' if err < tol else 'FAIL'}  ({results[-1]['seconds']} s)", flush=True)

    ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=dev)
    H, scale = 16, 192**-0.5
    for dtype in (torch.bfloat16, torch.float16):
        tag = str(dtype).split(".")[-1]
        g = torch.Generator(device="cpu").manual_seed(0)
        slots = 4096
        ckv = torch.randn(slots, 512, generator=g).to(dtype).to(dev)
        kpe = torch.randn(slots, 64, generator=g).to(dtype).to(dev)
        # draft decode: 6 branches, one query each, page_size 1
        lens = torch.tensor([40, 41, 93, 94, 7, 8], dtype=torch.int32)
        kv_indptr = torch.zeros(7, dtype=torch.int32)
        kv_indptr[1:] = torch.cumsum(lens, 0)
        kv_indices = torch.randperm(slots - 1, generator=g)[: int(kv_indptr[-1])].to(torch.int32) + 1
        qo = torch.arange(7, dtype=torch.int32)
        qn = torch.randn(6, H, 512, generator=g).to(dtype).to(dev)
        qp = torch.randn(6, H, 64, generator=g).to(dtype).to(dev)
        t0 = time.time()
        w = flashinfer.BatchMLAPagedAttentionWrapper(ws, backend="auto")
        w.plan(
            qo.to(dev), kv_indptr.to(dev), kv_indices.to(dev), lens.to(dev), H, 512, 64, 1, False, scale, dtype, dtype
        )
        out = w.run(qn, qp, ckv.unsqueeze(1), kpe.unsqueeze(1))
        ref = mla_ref(qn, qp, ckv, kpe, qo, kv_indptr, kv_indices.to(dev), lens, 1, False, scale)
        record(f"mla eager decode {tag}", float((out.float() - ref).abs().max()), t0, 2e-2)

        # graph mode + fast host re-plan
        t0 = time.time()
        cap = 3 * 128
        buf_qo = torch.arange(7, dtype=torch.int32, device=dev)
        buf_kvp = torch.zeros(7, dtype=torch.int32, device=dev)
        buf_idx = torch.zeros(cap * 6, dtype=torch.int32, device=dev)
        buf_len = torch.ones(6, dtype=torch.int32, device=dev)
        gw = flashinfer.BatchMLAPagedAttentionWrapper(
            ws,
            use_cuda_graph=True,
            qo_indptr=buf_qo,
            kv_indptr=buf_kvp,
            kv_indices=buf_idx,
            kv_len_arr=buf_len,
            backend="auto",
        )
        buf_idx[: len(kv_indices)].copy_(kv_indices.to(dev))
        gw.plan(
            buf_qo,
            kv_indptr.to(dev),
            buf_idx[: len(kv_indices)],
            lens.to(dev),
            H,
            512,
            64,
            1,
            False,
            scale,
            dtype,
            dtype,
        )
        qn_s, qp_s = qn.clone(), qp.clone()
        out_s = torch.empty_like(qn)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            gw.run(qn_s, qp_s, ckv.unsqueeze(1), kpe.unsqueeze(1), out=out_s)
        s.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            gw.run(qn_s, qp_s, ckv.unsqueeze(1), kpe.unsqueeze(1), out=out_s)
        lens2 = torch.tensor([50, 12, 93, 60, 7, 30], dtype=torch.int32)
        kvp2 = torch.zeros(7, dtype=torch.int32)
        kvp2[1:] = torch.cumsum(lens2, 0)
        idx2 = torch.randperm(slots - 1, generator=g)[: int(kvp2[-1])].to(torch.int32) + 1
        buf_idx[: len(idx2)].copy_(idx2.to(dev))
        buf_kvp.copy_(kvp2.to(dev))
        buf_len.copy_(lens2.to(dev))
        gw._cached_module.plan(
            gw._float_workspace_buffer,
            gw._int_workspace_buffer,
            gw._pin_memory_int_workspace_buffer,
            qo,
            kvp2,
            lens2,
            H,
            512,
            False,
        )
        graph.replay()
        torch.cuda.synchronize()
        ref = mla_ref(qn, qp, ckv, kpe, qo, kvp2, idx2.to(dev), lens2, 1, False, scale)
        record(f"mla graph + fast re-plan {tag}", float((out_s.float() - ref).abs().max()), t0, 2e-2)

        # causal, pages of 32 over a padded block table (the trtllm_mla stand-in)
        t0 = time.time()
        ps, bs, N, maxb = 32, 3, 4, 8
        seq = torch.tensor([41, 94, 9], dtype=torch.int32)
        table = torch.full((bs, maxb), -1, dtype=torch.int32)
        perm = torch.randperm(slots // ps - 1, generator=g) + 1
        used = 0
        for b in range(bs):
            n = math.ceil(int(seq[b]) / ps)
            table[b, :n] = perm[used : used + n].to(torch.int32)
            used += n
        qn = torch.randn(bs * N, H, 512, generator=g).to(dtype).to(dev)
        qp = torch.randn(bs * N, H, 64, generator=g).to(dtype).to(dev)
        qo = torch.arange(bs + 1, dtype=torch.int32) * N
        # FlashInfer's CSR plan wants exactly ceil(kv_len / page_size) pages per sequence: the
        # used prefix of each block-table row, packed.
        npages = (seq + ps - 1) // ps
        kvp = torch.zeros(bs + 1, dtype=torch.int32)
        kvp[1:] = torch.cumsum(npages, 0)
        idx = torch.cat([table[b, : int(npages[b])] for b in range(bs)]).to(dev)
        w = flashinfer.BatchMLAPagedAttentionWrapper(ws, backend="auto")
        w.plan(qo.to(dev), kvp.to(dev), idx, seq.to(dev), H, 512, 64, ps, True, scale, dtype, dtype)
        out = w.run(qn, qp, ckv.view(-1, ps, 512), kpe.view(-1, ps, 64))
        ref = mla_ref(qn, qp, ckv, kpe, qo, kvp, idx, seq, ps, True, scale)
        record(f"mla causal block table ps32 {tag}", float((out.float() - ref).abs().max()), t0, 2e-2)

        # GQA decode (group 2, head_dim 64)
        t0 = time.time()
        Hq, Hk, D = 4, 2, 64
        kc = torch.randn(slots, Hk, D, generator=g).to(dtype).to(dev)
        vc = torch.randn(slots, Hk, D, generator=g).to(dtype).to(dev)
        q = torch.randn(6, Hq, D, generator=g).to(dtype).to(dev)
        dw = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=False)
        dw.plan(
            kv_indptr.to(dev),
            kv_indices.to(dev),
            torch.ones(6, dtype=torch.int32, device=dev),
            Hq,
            Hk,
            D,
            1,
            data_type=dtype,
            q_data_type=dtype,
        )
        out = dw.forward(q, (kc.view(-1, 1, Hk, D), vc.view(-1, 1, Hk, D)), sm_scale=D**-0.5)
        refs = []
        for b in range(6):
            idx = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long().to(dev)
            k = kc[idx].float().repeat_interleave(2, 1)
            v = vc[idx].float().repeat_interleave(2, 1)
            p = (torch.einsum("hd,khd->hk", q[b].float(), k) * D**-0.5).softmax(-1)
            refs.append(torch.einsum("hk,khd->hd", p, v))
        record(f"gqa decode eager {tag}", float((out.float() - torch.stack(refs)).abs().max()), t0, 2e-2)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                relativize(
                    {"device": torch.cuda.get_device_name(), "flashinfer": flashinfer.__version__, "checks": results}
                ),
                f,
                indent=1,
            )
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
