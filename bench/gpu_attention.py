"""Paged decode attention reading KV through the two layouts, on VMM-backed 2 MiB pages (GPU).

A Triton decode-attention kernel (one program per sequence and query head, online softmax over
the sequence's blocks) reads K and V straight from the pool's buffer with the strides of
either layout, for every layer of a Llama-3.1-8B-shaped model:

* uniform cross-layer (BLNHC): block stride = all layers (2 MiB), cells ``[N, H, C]``;
* per-layer (LBHNC): block stride = one layer page (64 KiB), cells ``[H, N, C]``.

kvcached measured -31% end-to-end with the cross-layer layout on a GB10; this isolates the
attention kernel's share of that. Correctness is checked against a PyTorch reference first.
Run by bench/gpu_check.sh; ``TRITON_INTERPRET=1`` runs a tiny instance on the CPU.
"""

from __future__ import annotations

import math
import os
import random
from typing import Any

import torch
import triton
import triton.language as tl

from kvpool import Geometry, KVLayout, ModelShape


@triton.jit  # constexpr parameters are upper case by Triton convention
def _decode_attention(
    q_ptr, kv_ptr, table_ptr, lens_ptr, out_ptr,
    layer_off, block_stride, n_stride, h_stride, max_blocks, scale,
    NQ: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    qh = tl.program_id(1)
    kvh = qh // GROUP
    dims = tl.arange(0, D)
    toks = tl.arange(0, BLOCK_N)
    q = tl.load(q_ptr + (seq * NQ + qh) * D + dims).to(tl.float32)
    length = tl.load(lens_ptr + seq)
    m = tl.full((), float("-inf"), tl.float32)
    denom = tl.full((), 0.0, tl.float32)
    acc = tl.zeros((D,), tl.float32)
    for i in range(0, tl.cdiv(length, BLOCK_N)):
        block = tl.load(table_ptr + seq * max_blocks + i).to(tl.int64)
        valid = i * BLOCK_N + toks < length
        base = layer_off + block * block_stride + kvh * h_stride + toks[:, None] * n_stride + dims[None, :]
        k = tl.load(kv_ptr + base, mask=valid[:, None], other=0.0).to(tl.float32)
        v = tl.load(kv_ptr + base + D, mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.where(valid, tl.sum(k * q[None, :], 1) * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m - m_new)
        denom = denom * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        m = m_new
    tl.store(out_ptr + (seq * NQ + qh) * D + dims, acc / denom)


def strides(geo: Geometry) -> tuple[int, int, int, int]:
    """(layer stride, block stride, token stride, head stride) in elements of the KV dtype."""
    s, e = geo.shape, geo.shape.dtype_bytes
    c = 2 * s.head_dim
    if geo.layout is KVLayout.UNIFORM:
        n_stride, h_stride = s.num_kv_heads * c, c
    else:
        n_stride, h_stride = c, s.block_size * c
    return geo.layer_stride // e, geo.block_stride // e, n_stride, h_stride


def attention(kv: torch.Tensor, geo: Geometry, layer: int, q: torch.Tensor, table: torch.Tensor,
              lens: torch.Tensor) -> torch.Tensor:  # fmt: skip
    s = geo.shape
    seqs, nq, d = q.shape
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    ls, bs, ns, hs = strides(geo)
    _decode_attention[(seqs, nq)](
        q, kv, table, lens, out, layer * ls, bs, ns, hs, table.shape[1], 1.0 / math.sqrt(d),
        NQ=nq, GROUP=nq // s.num_kv_heads, BLOCK_N=s.block_size, D=d,
    )  # fmt: skip
    return out


def reference(kv: torch.Tensor, geo: Geometry, layer: int, q: torch.Tensor, table: torch.Tensor,
              lens: torch.Tensor) -> torch.Tensor:  # fmt: skip
    s = geo.shape
    ls, bs, ns, hs = strides(geo)
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    group = q.shape[1] // s.num_kv_heads
    for seq in range(q.shape[0]):
        n = int(lens[seq])
        blocks = table[seq, : -(-n // s.block_size)].tolist()
        for qh in range(q.shape[1]):
            offs = [layer * ls + b * bs + (qh // group) * hs + t * ns for b in blocks for t in range(s.block_size)][:n]
            idx = torch.tensor(offs, device=kv.device)[:, None] + torch.arange(2 * s.head_dim, device=kv.device)
            cells = kv[idx].float()
            k, v = cells[:, : s.head_dim], cells[:, s.head_dim :]
            w = torch.softmax(k @ q[seq, qh].float() / math.sqrt(s.head_dim), 0)
            out[seq, qh] = w @ v
    return out


def make_case(geo: Geometry, seqs: int, tokens: int, nq: int, device: str, seed: int = 0) -> Any:
    rng = random.Random(seed)
    per_seq = -(-tokens // geo.shape.block_size)
    ids = rng.sample(range(1, geo.num_blocks), seqs * per_seq)  # scattered, as after churn
    table = torch.tensor(ids, dtype=torch.int32, device=device).view(seqs, per_seq)
    lens = torch.full((seqs,), tokens, dtype=torch.int32, device=device)
    q = torch.randn(seqs, nq, geo.shape.head_dim, dtype=torch.bfloat16, device=device)
    return q, table, lens


def _check_tiny_on_cpu() -> None:
    """TRITON_INTERPRET=1: both layouts agree with the reference on a tiny case."""
    shape = ModelShape(num_layers=2, num_kv_heads=2, head_dim=16, dtype_bytes=2, block_size=4)
    for layout in KVLayout:
        geo = Geometry(shape, layout, num_blocks=16, page_bytes=shape.layer_page_bytes)
        kv = torch.randn(geo.total_bytes // 2, dtype=torch.bfloat16)
        q, table, lens = make_case(geo, seqs=2, tokens=10, nq=4, device="cpu")
        got, want = attention(kv, geo, 1, q, table, lens), reference(kv, geo, 1, q, table, lens)
        assert torch.allclose(got, want, atol=2e-2, rtol=2e-2), (layout, (got - want).abs().max())
        print(f"{layout.value}: matches the reference")


LLAMA8B = ModelShape(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2, block_size=16)


def _time_layers(kv: torch.Tensor, geo: Geometry, case: Any, repeat: int = 20) -> float:
    """Seconds for one decode step's attention over all layers (best of ``repeat``)."""
    q, table, lens = case
    for layer in range(geo.shape.num_layers):  # warm-up and compile
        attention(kv, geo, layer, q, table, lens)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for layer in range(geo.shape.num_layers):
            attention(kv, geo, layer, q, table, lens)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def main() -> None:
    from bench.common import write_result
    from kvpool.vmm.cuda import CudaBackend

    seqs, tokens, nq = 64, 1024, 32
    results: dict[str, Any] = {"seqs": seqs, "tokens": tokens, "model": "llama-3.1-8b shape, bf16, 16-token blocks"}
    for layout in KVLayout:
        geo = Geometry(LLAMA8B, layout, num_blocks=4608, page_bytes=2 << 20)  # 9 GiB, VMM-backed
        backend = CudaBackend(geo.total_bytes)
        for page in range(geo.num_pages):
            for r in geo.page_ranges(page):  # type: ignore[arg-type]
                backend.map(r.offset, r.length)
        kv = backend.as_tensor().view(torch.bfloat16)
        kv.normal_()
        small = make_case(geo, seqs=2, tokens=100, nq=nq, device="cuda", seed=1)
        got, want = attention(kv, geo, 3, *small), reference(kv, geo, 3, *small)
        err = float((got - want).abs().max())
        assert err < 5e-2, f"{layout.value}: kernel differs from the reference by {err}"
        secs = _time_layers(kv, geo, make_case(geo, seqs, tokens, nq, device="cuda"))
        kv_bytes = seqs * tokens * LLAMA8B.num_layers * LLAMA8B.num_kv_heads * LLAMA8B.cell_bytes
        results[layout.value] = {"step_ms": secs * 1e3, "kv_read_gbps": kv_bytes / secs / 1e9, "max_err": err}
        print(f"{layout.value}: {secs * 1e3:8.3f} ms per decode step (32 layers), {kv_bytes / secs / 1e9:7.1f} GB/s")
        del kv
        backend.close()
    ratio = results["BLNHC"]["step_ms"] / results["LBHNC"]["step_ms"]
    results["uniform_over_per_layer_time"] = ratio
    print(f"uniform (BLNHC) / per-layer (LBHNC) attention time: {ratio:.3f}x")
    write_result("gpu_attention", results)


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") == "1":
        _check_tiny_on_cpu()
    else:
        main()
