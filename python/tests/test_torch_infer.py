"""The sliding window, softcap, varlen and KV-cache calls with PyTorch CPU tensors through a live
fa-daemon (CPU backend): the autograd backward with a window and softcap against a float64
autograd reference (both ways in: the custom ops and the autograd Function), opcheck of the ops
with the window arguments, torch.compile(fullgraph=True) of a windowed call, varlen and KV-cache
(paged, with the append) on torch tensors against infer_ref.py, and the refusal of inputs that
require grad by the forward-only calls.

Optional: skipped with the reason when PyTorch is not installed (test_torch_cpu.py says how to
run it)."""
import math
import sys
import unittest
import warnings

import common  # noqa: F401  (the import path)

try:
    import torch
except ImportError:
    torch = None
NO_TORCH = ("PyTorch is not installed for %s (optional; test_torch_cpu.py says how to run it)"
            % sys.executable)

if torch is not None:
    import numpy as np

    import fa
    import fa._torch as FT
    import infer_ref as R
    from fa_daemon import Daemon
    from torch_ref import rel

    PATHS = ["op", "function"] if FT.HAVE_CUSTOM_OP else ["function"]
else:
    PATHS = []

TOL32 = 1e-5


def ref_window(q, k, v, causal, window, softcap, scale=None):
    """O [B, Sq, Hq, D] in float64, differentiable: BSHD, GQA, FlashAttention's window and
    softcap (infer_ref.keep_mask's rules); rows that see no key give 0."""
    q, k, v = (x.double() for x in (q, k, v))
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    k = k.repeat_interleave(Hq // Hkv, dim=2)
    v = v.repeat_interleave(Hq // Hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * (scale or 1.0 / math.sqrt(D))
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    keep = torch.from_numpy(R.keep_mask(Sq, Sk, causal, window))
    s = s.masked_fill(~keep, -math.inf)
    m = s.amax(-1, keepdim=True).detach()
    seen = torch.isfinite(m)
    p = torch.where(seen, torch.exp(s - torch.where(seen, m, torch.zeros_like(m))),
                    torch.zeros_like(s))
    l = p.sum(-1, keepdim=True)
    return torch.einsum("bhqk,bkhd->bqhd", p / torch.where(l > 0, l, torch.ones_like(l)), v)


@unittest.skipIf(torch is None, NO_TORCH)
class TorchInferenceOnCpuBackend(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        cls.c = fa.Client(cls.d.url)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.d.close()

    def setUp(self):
        self._path = FT.route
        self._warn = warnings.catch_warnings()
        self._warn.__enter__()
        warnings.simplefilter("ignore", fa.FaCopyWarning)
        self.g = torch.Generator().manual_seed(50)

    def tearDown(self):
        FT.route = self._path
        self._warn.__exit__(None, None, None)

    def randn(self, *shape, dtype=None):
        return torch.randn(*shape, generator=self.g, dtype=dtype or torch.float32)

    def test_backward_with_window_and_softcap_matches_float64_autograd(self):
        for path in PATHS:
            FT.route = path
            for (B, Sq, Sk, Hq, Hkv, D) in ((2, 7, 13, 4, 2, 16), (1, 13, 7, 3, 1, 8)):
                for causal, w, cap in ((True, (3, 0), 0.0), (False, (2, 5), 0.0),
                                       (False, (-1, -1), 1.5), (True, (6, -1), 2.0),
                                       (False, (4, -1), 0.0)):
                    what = "%s %s causal=%s window=%s softcap=%s" % (
                        path, (B, Sq, Sk, Hq, Hkv, D), causal, w, cap)
                    xs = [self.randn(*s).requires_grad_() for s in
                          ((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D))]
                    gout = self.randn(B, Sq, Hq, D)
                    o = fa.flash_attn_func(*xs, causal=causal, window_size=w, softcap=cap,
                                           client=self.c)
                    o.backward(gout)
                    rs = [x.detach().double().requires_grad_() for x in xs]
                    ro = ref_window(*rs, causal, w, cap)
                    ro.backward(gout.double())
                    self.assertLessEqual(rel(o, ro), TOL32, what + " o")
                    for n, x, r in zip("qkv", xs, rs):
                        e = rel(x.grad, r.grad)
                        self.assertLessEqual(e, TOL32, "%s d%s: %.3g" % (what, n, e))

    @unittest.skipUnless(torch is not None and FT.HAVE_CUSTOM_OP,
                         "torch.library.custom_op needs PyTorch >= 2.4")
    def test_opcheck_with_window_arguments_and_compile(self):
        cid = FT.client_id(self.c)
        q = self.randn(1, 6, 4, 8).requires_grad_()
        k = self.randn(1, 9, 2, 8).requires_grad_()
        torch.library.opcheck(torch.ops.fa.attn_fwd.default,
                              (q, k, k, False, fa.MASK_CAUSAL_BOTTOM_RIGHT, 0.0, 0, True,
                               False, cid, FT.STREAM_SYNC, 3, 0, 2.0))
        torch._dynamo.reset()

        def f(q, k):
            return fa.flash_attn_func(q, k, k, causal=True, window_size=(3, 0), softcap=2.0,
                                      client=self.c)
        y = torch.compile(f, fullgraph=True)(q, k)
        y.square().sum().backward()
        gq, gk = q.grad.clone(), k.grad.clone()
        q.grad = k.grad = None
        y0 = f(q, k)
        y0.square().sum().backward()
        self.assertLessEqual(rel(y, y0), 1e-6)
        self.assertLessEqual(rel(gq, q.grad), 1e-6)
        self.assertLessEqual(rel(gk, k.grad), 1e-6)

    def test_varlen_on_torch_tensors(self):
        lens_q, lens_k = [3, 0, 1, 9], [5, 4, 1, 0]
        cu_q = torch.tensor([0] + list(np.cumsum(lens_q)), dtype=torch.int32)
        cu_k = torch.tensor([0] + list(np.cumsum(lens_k)), dtype=torch.int32)
        q = self.randn(int(cu_q[-1]), 4, 16)
        k, v = self.randn(int(cu_k[-1]), 2, 16), self.randn(int(cu_k[-1]), 2, 16)
        for causal, w, cap in ((False, (-1, -1), 0.0), (True, (2, 0), 1.0)):
            o, lse = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 5, causal=causal,
                                               window_size=w, softcap=cap, return_lse=True,
                                               client=self.c)
            self.assertIsInstance(o, torch.Tensor)
            self.assertEqual(tuple(lse.shape), (4, q.shape[0]))
            wo, wl = R.varlen(q.numpy(), k.numpy(), v.numpy(), cu_q.numpy(), cu_k.numpy(),
                              causal, w, cap)
            self.assertLessEqual(rel(o, torch.from_numpy(wo)), TOL32)
            self.assertTrue(torch.equal(torch.isneginf(lse), torch.from_numpy(np.isneginf(wl))))

    def test_kvcache_paged_append_on_torch_tensors(self):
        B, Hq, Hkv, D, ps = 2, 4, 2, 8, 16
        pages = 6
        kp, vp = self.randn(pages, ps, Hkv, D), self.randn(pages, ps, Hkv, D)
        bt = torch.tensor([[4, 1, 3], [0, 5, 2]], dtype=torch.int32)
        lens = torch.tensor([14, 30], dtype=torch.int32)
        q = self.randn(B, 3, Hq, D)
        kn, vn = self.randn(B, 3, Hkv, D), self.randn(B, 3, Hkv, D)
        o, lse = fa.flash_attn_with_kvcache(q, kp, vp, kn, vn, cache_seqlens=lens,
                                            block_table=bt, causal=True,
                                            return_softmax_lse=True, client=self.c)
        self.assertEqual(tuple(lse.shape), (B, Hq, 3))
        for b in range(B):
            for t in range(3):
                j = int(lens[b]) + t
                self.assertTrue(torch.equal(kp[bt[b, j // ps], j % ps], kn[b, t]))
                self.assertTrue(torch.equal(vp[bt[b, j // ps], j % ps], vn[b, t]))
        self.assertEqual(lens.tolist(), [14, 30])
        wo, _ = R.kvcache(q.numpy(), kp.numpy(), vp.numpy(), (lens + 3).numpy(), bt.numpy(),
                          causal=True)
        self.assertLessEqual(rel(o, torch.from_numpy(wo)), TOL32)

    def test_forward_only_calls_refuse_inputs_that_require_grad(self):
        q = self.randn(4, 2, 8).requires_grad_()
        cu = torch.tensor([0, 4], dtype=torch.int32)
        with self.assertRaises(fa.FaNotSupportedError) as cm:
            fa.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, client=self.c)
        self.assertEqual(cm.exception.status, "FA_ENOTSUP")
        self.assertIn("torch.no_grad()", cm.exception.detail)
        kc = self.randn(1, 16, 2, 8).requires_grad_()
        with self.assertRaises(fa.FaNotSupportedError) as cm:
            fa.flash_attn_with_kvcache(q[None], kc, kc, cache_seqlens=3, client=self.c)
        self.assertIn("forward-only", cm.exception.detail)
        with torch.no_grad():
            o = fa.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, client=self.c)
        self.assertFalse(o.requires_grad)
        with self.assertRaises(fa.FaError) as cm:
            fa.flash_attn_with_kvcache(q[None].detach(), kc.detach(), kc.detach(),
                                       cache_seqlens=torch.tensor([3], dtype=torch.int64),
                                       client=self.c)
        self.assertEqual(cm.exception.status, "FA_EDTYPE")
        self.assertIn("torch.int32", cm.exception.detail)


if __name__ == "__main__":
    unittest.main()
