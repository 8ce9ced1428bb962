"""Training with PyTorch CPU tensors through a live fa-daemon (CPU backend): gradients against
float64 references (torch's own SDPA run in float64, and tests/torch_ref.py for the masks SDPA
lacks), torch.autograd.gradcheck, loss.backward() with GQA, upstream gradients of any strides,
the deterministic flag, torch.compile(fullgraph=True) of a module forward and backward,
torch.library.opcheck of fa::attn_fwd and fa::attn_bwd, and the errors. Both ways in: the custom
ops (PyTorch >= 2.4) and the torch.autograd.Function fallback.

Optional: skipped with the reason when PyTorch is not installed (CI has none). To run it:
    python3 -m venv --system-site-packages /tmp/fa-torch && /tmp/fa-torch/bin/pip install torch
    PYTHON=/tmp/fa-torch/bin/python sh python/tests/run.sh build
"""
import sys
import unittest
import warnings
from unittest import mock

import common  # noqa: F401  (the import path)

try:
    import torch
except ImportError:
    torch = None
NO_TORCH = ("PyTorch is not installed for %s (optional; the module's docstring says how to run "
            "it)" % sys.executable)

if torch is not None:
    import torch.nn.functional as F

    import fa
    import fa._bwd
    import fa._torch as FT
    from fa_daemon import Daemon
    from torch_ref import ref, ref_grads, rel

    PATHS = ["op", "function"] if FT.HAVE_CUSTOM_OP else ["function"]
else:
    PATHS = []

TOL32 = 1e-5  # fp32 inputs against float64: the CPU backend computes in float64, rounds once

# (B, Sq, Sk, Hq, Hkv, D)
SHAPES = [(1, 1, 1, 1, 1, 8), (2, 7, 13, 4, 2, 24), (1, 13, 7, 6, 3, 40), (2, 33, 20, 8, 1, 64)]


def leaves(*xs):
    return [x.detach().clone().requires_grad_() for x in xs]


@unittest.skipIf(torch is None, NO_TORCH)
class TorchTrainingOnCpuBackend(unittest.TestCase):
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
        warnings.simplefilter("ignore", fa.FaCopyWarning)  # CPU tensors are staged
        self.g = torch.Generator().manual_seed(20)

    def tearDown(self):
        FT.route = self._path
        self._warn.__exit__(None, None, None)

    def randn(self, *shape, dtype=None):
        return torch.randn(*shape, generator=self.g, dtype=dtype or torch.float32)

    def check(self, got, want, tol, what):
        for name, a, b in zip(("o", "dq", "dk", "dv"), got, want):
            self.assertIsNotNone(a, "%s: %s is None" % (what, name))
            self.assertEqual(tuple(a.shape), tuple(b.shape), "%s %s" % (what, name))
            e = rel(a, b)
            self.assertLessEqual(e, tol, "%s %s: relative error %.3g" % (what, name, e))

    def test_sdpa_gradients_match_torch_sdpa_in_float64(self):
        for path in PATHS:
            FT.route = path
            for B, Sq, Sk, Hq, Hkv, D in SHAPES:
                q = self.randn(B, Hq, Sq, D)
                k, v = self.randn(B, Hkv, Sk, D), self.randn(B, Hkv, Sk, D)
                gout = self.randn(B, Hq, Sq, D)
                for causal in (False, True):
                    for scale in (None, 0.3):
                        what = "op=%s %s causal=%s scale=%s" % (path, (B, Sq, Sk, Hq, Hkv, D),
                                                                causal, scale)
                        x = leaves(q, k, v)
                        o = fa.scaled_dot_product_attention(*x, is_causal=causal, scale=scale,
                                                            enable_gqa=True, client=self.c)
                        o.backward(gout)
                        y = leaves(q.double(), k.double(), v.double())
                        t = F.scaled_dot_product_attention(*y, is_causal=causal, scale=scale,
                                                           enable_gqa=True)
                        t.backward(gout.double())
                        self.check([o] + [a.grad for a in x], [t] + [b.grad for b in y],
                                   TOL32, what)
                        for a, b in zip(x, (q, k, v)):
                            self.assertEqual(a.grad.dtype, b.dtype)

    def test_flash_attn_func_bottom_right_gqa_and_rows_that_see_no_key(self):
        for path in PATHS:
            FT.route = path
            for B, Sq, Sk, Hq, Hkv, D in SHAPES + [(1, 9, 3, 4, 2, 16)]:
                q = self.randn(B, Sq, Hq, D)
                k, v = self.randn(B, Sk, Hkv, D), self.randn(B, Sk, Hkv, D)
                gout = self.randn(B, Sq, Hq, D)
                for causal in (False, True):
                    x = leaves(q, k, v)
                    o, lse = fa.flash_attn_func(*x, causal=causal, return_lse=True,
                                                client=self.c)
                    self.assertFalse(lse.requires_grad, "lse is not differentiable")
                    o.backward(gout)
                    want = ref_grads(q, k, v, gout, "br" if causal else "none")
                    self.check([o] + [a.grad for a in x], want, TOL32,
                               "op=%s flash %s causal=%s" % (path, (B, Sq, Sk, Hq, Hkv, D),
                                                             causal))
                    rl = ref(q, k, v, "br" if causal else "none")[1]
                    self.assertTrue(torch.equal(torch.isneginf(lse), torch.isneginf(rl)))

    def test_gradcheck(self):
        for path in PATHS:
            FT.route = path
            for causal in (False, True):
                q = self.randn(1, 3, 2, 8).requires_grad_()
                k = self.randn(1, 4, 1, 8).requires_grad_()
                v = self.randn(1, 4, 1, 8).requires_grad_()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # fp32, not double: fa's dtype
                    ok = torch.autograd.gradcheck(
                        lambda a, b, c: fa.flash_attn_func(a, b, c, causal=causal,
                                                           client=self.c),
                        (q, k, v), eps=1e-2, atol=1e-3, rtol=1e-2)
                self.assertTrue(ok)

    def test_loss_backward_with_gqa_gives_gradients_shaped_like_the_inputs(self):
        B, Hq, Hkv, S, D = 2, 8, 2, 19, 32
        for path in PATHS:
            FT.route = path
            q, k, v = leaves(self.randn(B, Hq, S, D), self.randn(B, Hkv, S, D),
                             self.randn(B, Hkv, S, D))
            loss = fa.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                                   client=self.c).square().mean()
            loss.backward()
            self.assertEqual([tuple(x.grad.shape) for x in (q, k, v)],
                             [(B, Hq, S, D), (B, Hkv, S, D), (B, Hkv, S, D)])
            y = leaves(q.double(), k.double(), v.double())
            F.scaled_dot_product_attention(*y, is_causal=True, enable_gqa=True
                                           ).square().mean().backward()
            for a, b in zip((q, k, v), y):
                self.assertLessEqual(rel(a.grad, b.grad), TOL32)
            # Only q requires grad: k and v get none, and no dk/dv reaches them.
            q2 = q.detach().requires_grad_()
            kd, vd = k.detach(), v.detach()
            fa.scaled_dot_product_attention(q2, kd, vd, enable_gqa=True,
                                            client=self.c).sum().backward()
            self.assertIsNotNone(q2.grad)
            self.assertIsNone(kd.grad)

    def test_upstream_gradients_of_any_strides(self):
        B, H, S, D = 2, 3, 11, 16
        q, k, v = self.randn(B, H, S, D), self.randn(B, H, S, D), self.randn(B, H, S, D)
        w = self.randn(B, S, H, 2 * D)
        # expanded (stride 0 in the head dim: copied), BSHD-strided (head dim contiguous: passed
        # as it is), head dim strided by 2 (copied)
        losses = {"o.sum()": lambda o: o.sum(),
                  "transposed": lambda o: (o.transpose(1, 2) * w[..., :D]).sum(),
                  "head dim strided": lambda o: (o * w[..., ::2].transpose(1, 2)).sum()}
        for path in PATHS:
            FT.route = path
            for name, loss in losses.items():
                x = leaves(q, k, v)
                seen = []
                real = fa._bwd.backward

                def spy(*a, **kw):
                    seen.append(a[4].stride())  # dout as fa gets it
                    return real(*a, **kw)
                with mock.patch.object(fa._bwd, "backward", spy):
                    loss(fa.scaled_dot_product_attention(*x, client=self.c)).backward()
                self.assertEqual(len(seen), 1)
                self.assertEqual(seen[0][-1], 1, name)
                y = leaves(q.double(), k.double(), v.double())
                loss(F.scaled_dot_product_attention(*y).to(torch.float64)).backward()
                for a, b in zip(x, y):
                    self.assertLessEqual(rel(a.grad, b.grad), TOL32,
                                         "op=%s %s" % (path, name))
        g = self.randn(B, S, H, D).transpose(1, 2)
        self.assertIs(FT.grad_for_fa(g), g, "head dim contiguous: no copy")
        e = torch.ones(()).expand(B, H, S, D)  # o.sum()'s gradient: every stride 0
        self.assertTrue(FT.grad_for_fa(e).is_contiguous())
        r = torch.ones(D).expand(B, H, S, D)    # stride 0 except the head dim: no copy
        self.assertIs(FT.grad_for_fa(r), r)

    def test_deterministic_flag_and_torch_deterministic_algorithms(self):
        q, k, v = self.randn(1, 21, 4, 32), self.randn(1, 30, 2, 32), self.randn(1, 30, 2, 32)
        for path in PATHS:
            FT.route = path
            flags = []
            real = fa._bwd.backward

            def spy(*a, **kw):
                flags.append(kw["deterministic"])
                return real(*a, **kw)
            runs = []
            with mock.patch.object(fa._bwd, "backward", spy):
                for det in (True, True, False):
                    x = leaves(q, k, v)
                    fa.flash_attn_func(*x, causal=True, deterministic=det,
                                       client=self.c).sum().backward()
                    runs.append([a.grad for a in x])
                old = torch.are_deterministic_algorithms_enabled()
                torch.use_deterministic_algorithms(True)
                try:
                    x = leaves(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
                    fa.scaled_dot_product_attention(*x, enable_gqa=True,
                                                    client=self.c).sum().backward()
                finally:
                    torch.use_deterministic_algorithms(old)
            self.assertEqual(flags, [True, True, False, True])
            for a, b in zip(*runs[:2]):
                self.assertTrue(torch.equal(a.view(torch.int32), b.view(torch.int32)))

    def test_no_grad_and_inference_take_the_plain_call(self):
        q = self.randn(1, 2, 5, 8).requires_grad_()
        with torch.no_grad():
            o = fa.scaled_dot_product_attention(q, q, q, client=self.c)
        self.assertIsNone(o.grad_fn)
        with torch.inference_mode():
            o = fa.scaled_dot_product_attention(q, q, q, client=self.c)
        self.assertFalse(o.requires_grad)
        o = fa.scaled_dot_product_attention(q.detach(), q.detach(), q.detach(), client=self.c)
        self.assertIsNone(o.grad_fn)
        FT.route = "auto"  # eager calls take the autograd.Function (cheaper than an op)
        o = fa.scaled_dot_product_attention(q, q, q, client=self.c)
        self.assertIn("AttnFunction", type(o.grad_fn).__name__)

    def test_the_low_level_calls_take_torch_tensors(self):
        q, k, v = self.randn(2, 9, 4, 16), self.randn(2, 12, 2, 16), self.randn(2, 12, 2, 16)
        gout = self.randn(2, 9, 4, 16)
        o, lse = fa.attn_fwd(q, k, v, mask=fa.MASK_CAUSAL_TOP_LEFT, return_lse=True,
                             client=self.c)
        grads = fa.attn_bwd(q, k, v, o, gout, lse, mask=fa.MASK_CAUSAL_TOP_LEFT,
                            deterministic=True, client=self.c)
        self.check([o] + list(grads), ref_grads(q, k, v, gout, "tl"), TOL32, "attn_bwd")
        dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
        got = fa.flash_attn_backward(gout, q, k, v, o, lse, dq, dk, dv, client=self.c,
                                     causal=False)
        self.assertIs(got[0], dq)
        o2, lse2 = fa.flash_attn_func(q, k, v, return_lse=True, client=self.c)
        fa.flash_attn_backward(gout, q, k, v, o2, lse2, dq, dk, dv, client=self.c)
        self.check([o2, dq, dk, dv], ref_grads(q, k, v, gout), TOL32, "flash_attn_backward")

    def test_errors(self):
        q = self.randn(1, 2, 5, 8).requires_grad_()
        with self.assertRaises(fa.FaArgumentError) as cm:
            fa.scaled_dot_product_attention(q, q, q, out=torch.empty(1, 2, 5, 8),
                                            client=self.c)
        self.assertEqual(cm.exception.status, "FA_EINVAL")
        self.assertIn("out=", cm.exception.detail)
        with self.assertRaises(fa.FaArgumentError) as cm:
            fa.scaled_dot_product_attention(q, q.detach().half(), q.detach(), client=self.c)
        self.assertEqual(cm.exception.status, "FA_EDTYPE")
        with self.assertRaises(fa.FaArgumentError) as cm:
            fa.scaled_dot_product_attention(q, self.randn(1, 1, 5, 8), self.randn(1, 1, 5, 8),
                                            client=self.c)
        self.assertEqual(cm.exception.status, "FA_ESHAPE")
        self.assertIn("enable_gqa", cm.exception.detail)
        # A forward run without lse has no gradient: FA_EINVAL at backward, with the reason.
        cid = FT.client_id(self.c)
        for path in PATHS:
            fn = (torch.ops.fa.attn_fwd if path == "op" else FT.AttnFunction.apply)
            o, lse = fn(q, q, q, True, 0, 0.0, 0, False, False, cid, FT.STREAM_SYNC)
            self.assertEqual(lse.numel(), 0)
            with self.assertRaises(fa.FaArgumentError) as cm:
                o.sum().backward()
            self.assertEqual(cm.exception.status, "FA_EINVAL")
            self.assertIn("return_lse=True", cm.exception.detail)

    def test_double_backward_is_refused_not_wrong(self):
        for path in PATHS:
            FT.route = path
            q = self.randn(1, 2, 5, 8).requires_grad_()
            o = fa.scaled_dot_product_attention(q, q, q, client=self.c)
            g, = torch.autograd.grad(o.square().sum(), q, create_graph=True)
            with self.assertRaises(RuntimeError, msg=path):
                g.sum().backward()

    def test_a_pytorch_without_custom_op_falls_back_to_the_autograd_function(self):
        import subprocess
        prog = "\n".join([
            "import sys, warnings; sys.path[:0] = %r" % sys.path[:3],
            "import torch",
            "del torch.library.custom_op  # as PyTorch < 2.4 has it",
            "import fa, fa._torch as FT",
            "assert not FT.HAVE_CUSTOM_OP and not hasattr(torch.ops.fa, 'attn_fwd')",
            "warnings.simplefilter('ignore', fa.FaCopyWarning)",
            "c = fa.Client(%r)" % self.d.url,
            "q = torch.randn(1, 2, 5, 8, requires_grad=True)",
            "o = fa.scaled_dot_product_attention(q, q, q, is_causal=True, client=c)",
            "o.square().sum().backward()",
            "print(type(o.grad_fn).__name__, tuple(q.grad.shape))",
            "c.close()"])
        r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("AttnFunction", r.stdout)
        self.assertIn("(1, 2, 5, 8)", r.stdout)

    @unittest.skipUnless(torch is not None and FT.HAVE_CUSTOM_OP,
                         "torch.library.custom_op needs PyTorch >= 2.4")
    def test_opcheck_of_the_custom_ops(self):
        cid = FT.client_id(self.c)
        q = self.randn(2, 7, 4, 16).requires_grad_()
        k = self.randn(2, 10, 2, 16).requires_grad_()
        v = self.randn(2, 10, 2, 16).requires_grad_()
        for mask in (fa.MASK_NONE, fa.MASK_CAUSAL_BOTTOM_RIGHT):
            torch.library.opcheck(torch.ops.fa.attn_fwd.default,
                                  (q, k, v, False, mask, 0.0, 0, True, False, cid,
                                   FT.STREAM_SYNC))
            o, lse = torch.ops.fa.attn_fwd(q.detach(), k.detach(), v.detach(), False, mask,
                                           0.0, 0, True, False, cid, FT.STREAM_SYNC)
            torch.library.opcheck(torch.ops.fa.attn_bwd.default,
                                  (self.randn(2, 7, 4, 16), q.detach(), k.detach(), v.detach(),
                                   o, lse, False, mask, 0.0, 0, False, cid, FT.STREAM_SYNC))
        qb = self.randn(1, 3, 6, 8).requires_grad_()
        torch.library.opcheck(torch.ops.fa.attn_fwd.default,
                              (qb, qb, qb, True, fa.MASK_CAUSAL_TOP_LEFT, 0.5, 0, True, True,
                               cid, FT.STREAM_SYNC))


class _Block(torch.nn.Module if torch is not None else object):
    """A small attention block: projections, fa's SDPA (GQA, causal), output projection."""

    def __init__(self, client, d=32, hq=4, hkv=2, hd=8):
        super().__init__()
        self.client, self.hq, self.hkv, self.hd = client, hq, hkv, hd
        self.wq = torch.nn.Linear(d, hq * hd)
        self.wkv = torch.nn.Linear(d, 2 * hkv * hd)
        self.wo = torch.nn.Linear(hq * hd, d)

    def forward(self, x):
        B, S, _ = x.shape
        q = self.wq(x).view(B, S, self.hq, self.hd).transpose(1, 2)
        kv = self.wkv(x).view(B, S, 2, self.hkv, self.hd)
        k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
        o = fa.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                            client=self.client)
        return self.wo(o.transpose(1, 2).reshape(B, S, -1))


@unittest.skipIf(torch is None, NO_TORCH)
@unittest.skipUnless(torch is not None and FT.HAVE_CUSTOM_OP and hasattr(torch, "compile"),
                     "torch.compile through fa's custom ops needs PyTorch >= 2.4")
class TorchCompile(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        cls.c = fa.Client(cls.d.url)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.d.close()

    def setUp(self):
        warnings.simplefilter("ignore", fa.FaCopyWarning)
        torch._dynamo.reset()

    def run_block(self, fn, m, x):
        for p in m.parameters():
            p.grad = None
        y = fn(x)
        y.square().sum().backward()
        return [y.detach()] + [p.grad.clone() for p in m.parameters()]

    def test_the_graph_holds_fa_ops_and_no_break(self):
        torch.manual_seed(0)
        m = _Block(self.c)
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward
        x = torch.randn(2, 13, 32)
        y = torch.compile(m, backend=backend, fullgraph=True)(x)
        self.assertEqual(len(graphs), 1)
        text = str(graphs[0].graph)
        self.assertIn("fa.attn_fwd", text)
        self.assertLessEqual(rel(y, m(x)), 1e-6)

    def test_compile_fullgraph_forward_and_backward_match_eager(self):
        torch.manual_seed(1)
        m = _Block(self.c)
        x = torch.randn(2, 13, 32)
        eager = self.run_block(m, m, x)
        compiled = torch.compile(m, fullgraph=True)
        got = self.run_block(compiled, m, x)
        again = self.run_block(compiled, m, x)
        for a, b, c in zip(got, eager, again):
            self.assertLessEqual(rel(a, b), 1e-5)
            self.assertTrue(torch.equal(a, c))


if __name__ == "__main__":
    unittest.main()
