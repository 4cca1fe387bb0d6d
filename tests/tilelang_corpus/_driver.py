"""What the corpus drivers share: seeded inputs and float64 references. Not part of any ported kernel."""
from __future__ import annotations

import torch

torch.manual_seed(0)


def randn(*shape, dtype=torch.float16):
    return torch.randn(*shape, dtype=torch.float64).to(dtype)


def f64(t):
    return t.detach().to(torch.float64)


def attention_ref(q, k, v, causal=False, layout="bhsd", groups=1):
    """softmax(q k^T / sqrt(d)) v in float64; layout bhsd or bshd; k and v may have heads / groups heads.
    A causal mask is aligned to the end (query i sees keys up to i + seq_kv - seq_q)."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        sq, sk = s.shape[-2], s.shape[-1]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril(sk - sq)
        s = s.masked_fill(~mask, float("-inf"))
    o = s.softmax(-1) @ v
    return o.transpose(1, 2) if layout == "bshd" else o


def attention_lse2(q, k, causal=False, layout="bhsd", groups=1):
    """The log2-sum-exp of each query row's scores q k^T / sqrt(d) in float64, (batch, heads, seq_q): what the
    forward kernels of the backward examples store as ``lse`` (their softmax runs in base 2)."""
    q, k = (t.to(torch.float64) for t in (q, k))
    if layout == "bshd":
        q, k = (t.transpose(1, 2) for t in (q, k))
    k = k.repeat_interleave(groups, dim=1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        sq, sk = s.shape[-2], s.shape[-1]
        s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq), float("-inf"))
    return torch.logsumexp(s, -1) / torch.log(torch.tensor(2.0, dtype=torch.float64))


def attention_grads(q, k, v, do, causal=False, layout="bhsd", groups=1):
    """float64 (dq, dk, dv) of attention_ref."""
    q, k, v = (f64(t).requires_grad_() for t in (q, k, v))
    attention_ref(q, k, v, causal, layout, groups).backward(f64(do))
    return q.grad, k.grad, v.grad


def causal_linear_ref(q, k, v, scale, decay=None):
    """o_t = sum_{s <= t} decay^(t-s) scale (q_t . k_s) v_s in float64, layout (B, S, H, D); decay per head or None."""
    q, k, v = (f64(t).transpose(1, 2) for t in (q, k, v))
    S = q.shape[2]
    w = torch.ones(S, S, dtype=torch.float64).tril()
    if decay is not None:
        d = torch.tensor(decay, dtype=torch.float64).view(-1, 1, 1)
        idx = torch.arange(S, dtype=torch.float64)
        w = w * d ** (idx.view(-1, 1) - idx.view(1, -1)).clamp(min=0)
    o = ((q @ k.transpose(-1, -2)) * scale * w) @ v
    return o.transpose(1, 2)
