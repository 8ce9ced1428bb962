"""What the Python tests share: the import path (the in-tree package and library), a float64
reference of attention, the relative error the C tests use, and random inputs."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # python/: the package from the tree
sys.path.insert(0, HERE)

try:
    import numpy as np
except ImportError:  # the test modules skip with this reason
    np = None
NO_NUMPY = "NumPy is not installed for %s (make deps installs python3-numpy)" % sys.executable

TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


def reference(q, k, v, mask="none", scale=None):
    """O [B, Sq, Hq, D] and lse [B, Hq, Sq] in float64 from BSHD inputs. mask: "none",
    "bottom_right" (FlashAttention's causal), "top_left" (PyTorch's is_causal). A row that
    sees no key: O = 0, lse = -inf."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    k = np.repeat(k, Hq // Hkv, axis=2)
    v = np.repeat(v, Hq // Hkv, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * (scale if scale else 1.0 / np.sqrt(D))
    i = np.arange(Sq)[:, None]
    j = np.arange(Sk)[None, :]
    if mask == "bottom_right":
        s = np.where(j <= i + Sk - Sq, s, -np.inf)
    elif mask == "top_left":
        s = np.where(j <= i, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    seen = np.isfinite(m)
    p = np.where(seen, np.exp(s - np.where(seen, m, 0.0)), 0.0)
    l = p.sum(axis=-1, keepdims=True)
    o = np.einsum("bhqk,bkhd->bqhd", p / np.where(l > 0, l, 1.0), v)
    with np.errstate(divide="ignore"):
        lse = np.where(seen, m + np.log(np.where(l > 0, l, 1.0)), -np.inf)[..., 0]
    return o, lse


def rel_err(got, want):
    """Relative Frobenius error; inf when got has a NaN."""
    got = np.asarray(got, dtype=np.float64)
    if np.isnan(got).any():
        return float("inf")
    d = np.linalg.norm(got - want)
    n = np.linalg.norm(want)
    return float(d / n) if n > 0 else float(d)


def lse_err(got, want):
    """Largest absolute lse difference over finite rows; inf when the -inf rows differ."""
    got = np.asarray(got, dtype=np.float64)
    if not np.array_equal(np.isneginf(got), np.isneginf(want)):
        return float("inf")
    f = np.isfinite(want)
    return float(np.abs(got[f] - want[f]).max()) if f.any() else 0.0


def rand(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def reference_bwd(q, k, v, dout, mask="none", scale=None, o=None, lse=None):
    """dQ, dK, dV in float64 from BSHD inputs and dout = dL/dO [B, Sq, Hq, D], by the chain rule
    through softmax written out directly (P from the exact forward, or from the o and lse given:
    the daemon's, to bound only the backward's own rounding). GQA: dK and dV summed over each
    group of Hq // Hkv query heads. Rows that see no key add nothing."""
    q, k, v, dout = (np.asarray(x, dtype=np.float64) for x in (q, k, v, dout))
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    g = Hq // Hkv
    sc = scale if scale else 1.0 / np.sqrt(D)
    if o is None or lse is None:
        o, lse = reference(q, k, v, mask, scale)
    o = np.asarray(o, dtype=np.float64)
    lse = np.asarray(lse, dtype=np.float64)
    kr = np.repeat(k, g, axis=2)
    vr = np.repeat(v, g, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, kr) * sc
    i = np.arange(Sq)[:, None]
    j = np.arange(Sk)[None, :]
    keep = np.ones((Sq, Sk), bool)
    if mask == "bottom_right":
        keep = j <= i + Sk - Sq
    elif mask == "top_left":
        keep = j <= i
    fin = np.isfinite(lse)[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(keep & fin, np.exp(s - np.where(fin, lse[..., None], 0.0)), 0.0)
    dv = np.einsum("bhqk,bqhd->bkhd", p, dout)
    dp = np.einsum("bqhd,bkhd->bhqk", dout, vr)
    delta = np.einsum("bqhd,bqhd->bhq", dout, o)[..., None]
    ds = p * (dp - delta)
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kr) * sc
    dk = np.einsum("bhqk,bqhd->bkhd", ds, q) * sc
    dk = dk.reshape(B, Sk, Hkv, g, D).sum(axis=3)
    dv = dv.reshape(B, Sk, Hkv, g, D).sum(axis=3)
    return dq, dk, dv
