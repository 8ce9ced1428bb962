"""A float64 NumPy reference of the sliding window, softcap, variable-length and KV-cache
attention, written out directly per sequence (no fa code), for the inference tests."""
import numpy as np


def keep_mask(Sq, Sk, causal, window, top_left=False):
    """[Sq, Sk] bool: which keys query i sees. FlashAttention's rules: aligned bottom-right
    (a = Sk - Sq) unless top_left; window (left, right), -1 unbounded; causal caps right at 0."""
    a = 0 if top_left else Sk - Sq
    i = np.arange(Sq)[:, None] + a
    j = np.arange(Sk)[None, :]
    keep = np.ones((Sq, Sk), bool)
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


def attend(q, k, v, keep, scale=None, softcap=0.0):
    """One sequence: q [Sq, Hq, D], k, v [Sk, Hkv, Dv], keep [Sq, Sk] -> (o [Sq, Hq, Dv],
    lse [Hq, Sq]); a row that sees no key gets o = 0, lse = -inf."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[0], k.shape[1]
    if Sk == 0 or Sq == 0:
        return np.zeros((Sq, Hq, v.shape[2])), np.full((Hq, Sq), -np.inf)
    k = np.repeat(k, Hq // Hkv, axis=1)
    v = np.repeat(v, Hq // Hkv, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) * (scale if scale else 1.0 / np.sqrt(D))
    if softcap:
        s = softcap * np.tanh(s / softcap)
    s = np.where(keep[None], s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    seen = np.isfinite(m)
    p = np.where(seen, np.exp(s - np.where(seen, m, 0.0)), 0.0)
    l = p.sum(axis=-1, keepdims=True)
    o = np.einsum("hqk,khd->qhd", p / np.where(l > 0, l, 1.0), v)
    with np.errstate(divide="ignore"):
        lse = np.where(seen, m + np.log(np.where(l > 0, l, 1.0)), -np.inf)[..., 0]
    return o, lse


def dense(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None, top_left=False):
    """BSHD batch: (o [B, Sq, Hq, Dv], lse [B, Hq, Sq])."""
    res = [attend(q[b], k[b], v[b], keep_mask(q.shape[1], k.shape[1], causal, window,
                                              top_left), scale, softcap)
           for b in range(q.shape[0])]
    return np.stack([r[0] for r in res]), np.stack([r[1] for r in res])


def varlen(q, k, v, cu_q, cu_k, causal=False, window=(-1, -1), softcap=0.0, scale=None):
    """Packed: (o [total_q, Hq, Dv] with rows past cu_q[-1] zero, lse [Hq, total_q] with -inf
    there)."""
    o = np.zeros(q.shape[:2] + (v.shape[2],))
    lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        ob, lb = attend(q[q0:q1], k[k0:k1], v[k0:k1],
                        keep_mask(q1 - q0, k1 - k0, causal, window), scale, softcap)
        o[q0:q1] = ob
        lse[:, q0:q1] = lb
    return o, lse


def gather_cache(k_cache, b, n, block_table=None):
    """The first n keys of sequence b from a contiguous cache or paged pools."""
    if block_table is None:
        return np.asarray(k_cache[b, :n])
    ps = k_cache.shape[1]
    rows = [k_cache[block_table[b][j // ps], j % ps] for j in range(n)]
    return np.stack(rows) if rows else np.zeros((0,) + k_cache.shape[2:], k_cache.dtype)


def kvcache(q, k_cache, v_cache, lens, block_table=None, causal=False, window=(-1, -1),
            softcap=0.0, scale=None):
    """q [B, Sq, Hq, D] against the first lens[b] keys of each cache: (o, lse [B, Hq, Sq])."""
    os_, ls = [], []
    for b in range(q.shape[0]):
        kb = gather_cache(k_cache, b, lens[b], block_table)
        vb = gather_cache(v_cache, b, lens[b], block_table)
        ob, lb = attend(q[b], kb, vb, keep_mask(q.shape[1], lens[b], causal, window), scale,
                        softcap)
        os_.append(ob)
        ls.append(lb)
    return np.stack(os_), np.stack(ls)
