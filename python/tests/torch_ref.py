"""A float64 reference of attention in PyTorch, differentiable (so its gradients are the float64
reference of fa's backward), on any device: BSHD tensors, GQA/MQA, both causal alignments, rows
that see no key giving O = 0, lse = -inf and no gradient. For the torch tests and the GPU check."""
import math

import torch


def ref(q, k, v, mask="none", scale=None):
    """O [B, Sq, Hq, D] and lse [B, Hq, Sq] in float64. mask: "none", "br" (bottom-right,
    FlashAttention's causal) or "tl" (top-left, PyTorch's is_causal)."""
    q, k, v = (x.double() for x in (q, k, v))
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    k = k.repeat_interleave(Hq // Hkv, dim=2)
    v = v.repeat_interleave(Hq // Hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * (scale or 1.0 / math.sqrt(D))
    i = torch.arange(Sq, device=q.device)[:, None]
    j = torch.arange(Sk, device=q.device)[None, :]
    if mask == "br":
        s = s.masked_fill(~(j <= i + Sk - Sq), -math.inf)
    elif mask == "tl":
        s = s.masked_fill(~(j <= i), -math.inf)
    m = s.amax(-1, keepdim=True).detach()
    seen = torch.isfinite(m)
    p = torch.where(seen, torch.exp(s - torch.where(seen, m, torch.zeros_like(m))),
                    torch.zeros_like(s))
    l = p.sum(-1, keepdim=True)
    o = torch.einsum("bhqk,bkhd->bqhd", p / torch.where(l > 0, l, torch.ones_like(l)), v)
    lse = torch.where(seen, m + torch.log(torch.where(l > 0, l, torch.ones_like(l))),
                      torch.full_like(m, -math.inf))[..., 0]
    return o, lse


def ref_grads(q, k, v, dout, mask="none", scale=None):
    """(O, dQ, dK, dV) in float64: the reference's autograd, for BSHD inputs and dout."""
    xs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    o, _ = ref(*xs, mask=mask, scale=scale)
    o.backward(dout.double())
    return o.detach(), xs[0].grad, xs[1].grad, xs[2].grad


def rel(got, want):
    """Relative Frobenius error in float64; inf when got has a NaN."""
    got = got.detach().double()
    if torch.isnan(got).any():
        return math.inf
    want = want.detach().double().to(got.device)
    n = torch.linalg.norm(want).item()
    d = torch.linalg.norm(got - want).item()
    return d / n if n > 0 else d
