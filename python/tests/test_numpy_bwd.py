"""The backward from NumPy arrays through a live fa-daemon (CPU backend) against a float64
reference of the gradients (tests/common.py: reference_bwd, itself checked here against finite
differences of the forward reference): odd shapes, Sq != Sk, GQA/MQA, every mask, fp32/fp16
(bf16 with ml_dtypes), both layouts, strided views, outputs in shared memory written whole; the
deterministic flag bit for bit; the errors with their status and detail."""
import unittest
import warnings

from common import NO_NUMPY, np, rand, reference, reference_bwd, rel_err

if np is not None:
    import fa
    import fa._attn
    from fa_daemon import Daemon

# (B, Sq, Sk, Hq, Hkv, D): one row, Sq > Sk (bottom-right rows that see no key), MQA, odd sizes
SHAPES = [(1, 1, 1, 1, 1, 8), (2, 7, 13, 4, 2, 24), (1, 13, 7, 6, 3, 40),
          (2, 33, 65, 8, 1, 64), (1, 17, 17, 2, 2, 128), (1, 1, 70, 4, 4, 8)]
MASKS = {"none": 0, "bottom_right": 1, "top_left": 2}
# Against the exact float64 forward: the forward's rounding of O and lse feeds the backward.
TOL = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}
# Against the reference fed the daemon's own O and lse: the gradients' final rounding only.
TIGHT = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 4e-3}


@unittest.skipIf(np is None, NO_NUMPY)
class ReferenceIsTheGradient(unittest.TestCase):
    def test_reference_bwd_matches_finite_differences_of_the_forward(self):
        rng = np.random.default_rng(10)
        B, Sq, Sk, Hq, Hkv, D = 1, 3, 4, 4, 2, 8
        q, k, v, do = (rng.standard_normal(s) for s in ((B, Sq, Hq, D), (B, Sk, Hkv, D),
                                                        (B, Sk, Hkv, D), (B, Sq, Hq, D)))
        for mask in ("none", "bottom_right", "top_left"):
            grads = reference_bwd(q, k, v, do, mask, 0.7)
            for i, (x, g) in enumerate(zip((q, k, v), grads)):
                fd = np.zeros_like(x)
                for idx in np.ndindex(x.shape):
                    pm = []
                    for h in (1e-6, -1e-6):
                        args = [q, k, v]
                        args[i] = x.copy()
                        args[i][idx] += h
                        pm.append((reference(*args, mask, 0.7)[0] * do).sum())
                    fd[idx] = (pm[0] - pm[1]) / 2e-6
                self.assertLess(np.abs(fd - g).max(), 1e-7, "%s d%s" % (mask, "qkv"[i]))


@unittest.skipIf(np is None, NO_NUMPY)
class NumpyBackwardOnCpuBackend(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        cls.c = fa.Client(cls.d.url)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.d.close()

    def check(self, grads, want, tol, what):
        for name, got, w in zip(("dq", "dk", "dv"), grads, want):
            self.assertEqual(got.shape, w.shape, what + " " + name)
            e = rel_err(got, w)
            self.assertLessEqual(e, tol, "%s %s: relative error %.3g" % (what, name, e))

    def case(self, rng, dtype, B, Sq, Sk, Hq, Hkv, D):
        return (rand(rng, (B, Sq, Hq, D), dtype), rand(rng, (B, Sk, Hkv, D), dtype),
                rand(rng, (B, Sk, Hkv, D), dtype), rand(rng, (B, Sq, Hq, D), dtype))

    def test_flash_attn_backward_matches_reference_over_shapes_masks_dtypes(self):
        rng = np.random.default_rng(11)
        for dtype in ("float32", "float16"):
            for shape in SHAPES:
                q, k, v, do = self.case(rng, dtype, *shape)
                for causal in (False, True):
                    what = "%s %s causal=%s" % (dtype, shape, causal)
                    mask = "bottom_right" if causal else "none"
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", fa.FaCopyWarning)
                        o, lse = fa.flash_attn_func(q, k, v, causal=causal, return_lse=True,
                                                    client=self.c)
                        grads = fa.flash_attn_backward(do, q, k, v, o, lse, causal=causal,
                                                       client=self.c)
                    for g, x in zip(grads, (q, k, v)):
                        self.assertEqual((g.shape, g.dtype), (x.shape, x.dtype), what)
                    self.check(grads, reference_bwd(q, k, v, do, mask), TOL[dtype], what)
                    self.check(grads, reference_bwd(q, k, v, do, mask, o=o, lse=lse),
                               TIGHT[dtype], what + " (daemon's O, lse)")

    def test_attn_bwd_top_left_bhsd_strided_with_a_scale(self):
        rng = np.random.default_rng(12)
        for B, Sq, Sk, Hq, Hkv, D in SHAPES[1:5]:
            # BHSD views of BSHD memory (strided) for the inputs, contiguous BHSD for dout
            q, k, v, do = self.case(rng, "float32", B, Sq, Sk, Hq, Hkv, D)
            qb, kb, vb = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
            for mask in ("none", "top_left", "bottom_right"):
                what = "bhsd %s %s" % ((B, Sq, Sk, Hq, Hkv, D), mask)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", fa.FaCopyWarning)
                    ob, lse = fa.attn_fwd(qb, kb, vb, layout="bhsd", mask=MASKS[mask],
                                          scale=0.3, return_lse=True, client=self.c)
                    grads = fa.attn_bwd(qb, kb, vb, ob,
                                        np.ascontiguousarray(do.transpose(0, 2, 1, 3)), lse,
                                        layout="bhsd", mask=MASKS[mask], scale=0.3,
                                        client=self.c)
                self.check([g.transpose(0, 2, 1, 3) for g in grads],
                           reference_bwd(q, k, v, do, mask, 0.3), TOL["float32"], what)

    def test_shared_memory_outputs_are_written_whole_in_place_without_a_copy(self):
        rng = np.random.default_rng(13)
        B, Sq, Sk, Hq, Hkv, D = 2, 21, 30, 6, 2, 32
        c = self.c
        # Packed qkv in shared memory, strided BSHD views of it: no copy anywhere.
        q = fa.empty_host((B, Sq, Hq, D), "float16", client=c)
        kv = fa.empty_host((B, Sk, 2, Hkv, D), "float16", client=c)
        q[...] = rand(rng, q.shape, "float16")
        kv[...] = rand(rng, kv.shape, "float16")
        k, v = kv[:, :, 0], kv[:, :, 1]
        o = fa.empty_host(q.shape, "float16", client=c)
        lse = fa.empty_host((B, Hq, Sq), "float32", client=c)
        do = fa.empty_host(q.shape, "float16", client=c)
        do[...] = rand(rng, do.shape, "float16")
        grads = [fa.empty_host(x.shape, "float16", client=c) for x in (q, k, v)]
        for g in grads:
            g[...] = np.nan  # poisoned: every element must be written
        fa._attn._warned.clear()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            fa.attn_fwd(q, k, v, mask=fa.MASK_CAUSAL_BOTTOM_RIGHT, out=o, lse=lse, client=c)
            got = fa.flash_attn_backward(do, q, k, v, o, lse, *grads, causal=True, client=c)
        self.assertEqual([x for x in w if issubclass(x.category, fa.FaCopyWarning)], [])
        for g, mine in zip(got, grads):
            self.assertIs(g, mine)
            self.assertFalse(np.isnan(g).any(), "an output element was not written")
        self.check(got, reference_bwd(q, k, v, do, "bottom_right", o=o, lse=lse),
                   TIGHT["float16"], "shared memory")

    def test_deterministic_flag_gives_the_same_bits_twice(self):
        rng = np.random.default_rng(14)
        q, k, v, do = self.case(rng, "float32", 2, 37, 45, 8, 2, 64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fa.FaCopyWarning)
            o, lse = fa.flash_attn_func(q, k, v, causal=True, return_lse=True, client=self.c)
            runs = [fa.flash_attn_backward(do, q, k, v, o, lse, causal=True, deterministic=True,
                                           client=self.c) for _ in range(2)]
            plain = fa.flash_attn_backward(do, q, k, v, o, lse, causal=True, client=self.c)
        for a, b in zip(*runs):
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
        self.check(runs[0], reference_bwd(q, k, v, do, "bottom_right"), TOL["float32"],
                   "deterministic")
        self.check(plain, runs[0], 1e-6, "atomic mode against deterministic")

    def test_bfloat16_through_ml_dtypes(self):
        try:
            import ml_dtypes
        except ImportError:
            self.skipTest("ml_dtypes is not installed (NumPy has no bfloat16 of its own)")
        rng = np.random.default_rng(15)
        bf = ml_dtypes.bfloat16
        q, k, v, do = (x.astype(bf) for x in self.case(rng, "float32", 1, 12, 20, 4, 2, 64))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fa.FaCopyWarning)
            o, lse = fa.flash_attn_func(q, k, v, causal=True, return_lse=True, client=self.c)
            grads = fa.flash_attn_backward(do, q, k, v, o, lse, causal=True, client=self.c)
        f = [x.astype(np.float32) for x in (q, k, v, do)]
        self.assertEqual(grads[0].dtype, bf)
        self.check([g.astype(np.float32) for g in grads], reference_bwd(*f, "bottom_right"),
                   TOL["bfloat16"], "bf16")


@unittest.skipIf(np is None, NO_NUMPY)
class BackwardErrors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        cls.c = fa.Client(cls.d.url)
        rng = np.random.default_rng(16)
        cls.q = rand(rng, (1, 6, 4, 16), "float32")
        cls.k = rand(rng, (1, 9, 2, 16), "float32")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fa.FaCopyWarning)
            cls.o, cls.lse = fa.flash_attn_func(cls.q, cls.k, cls.k, return_lse=True,
                                                client=cls.c)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.d.close()

    def setUp(self):
        warnings.simplefilter("ignore", fa.FaCopyWarning)

    def bwd(self, **kw):
        a = dict(dout=self.o, q=self.q, k=self.k, v=self.k, out=self.o, softmax_lse=self.lse,
                 client=self.c)
        a.update(kw)
        return fa.flash_attn_backward(**a)

    def raises(self, status, cls, detail_has, **kw):
        with self.assertRaises(cls) as cm:
            self.bwd(**kw)
        e = cm.exception
        self.assertIsInstance(e, fa.FaError)
        self.assertEqual(e.status, status, str(e))
        self.assertTrue(e.detail, "a detail text comes with %s" % status)
        for part in detail_has:
            self.assertIn(part, e.detail)
        self.assertIn(status, str(e))
        return e

    def test_the_arguments_as_given_work(self):
        grads = self.bwd()
        self.assertEqual([g.shape for g in grads], [self.q.shape, self.k.shape, self.k.shape])

    def test_missing_lse_is_FA_EINVAL_naming_return_lse(self):
        self.raises("FA_EINVAL", fa.FaArgumentError, ["lse", "return_lse=True"],
                    softmax_lse=None)

    def test_lse_of_the_wrong_shape_is_FA_ESHAPE_from_the_library(self):
        self.raises("FA_ESHAPE", ValueError, ["lse"], softmax_lse=self.lse[:, :3].copy())
        self.raises("FA_ESHAPE", fa.FaArgumentError, ["lse", "2 dimensions", "takes 3"],
                    softmax_lse=self.lse[0])

    def test_lse_not_float32_is_FA_EDTYPE(self):
        self.raises("FA_EDTYPE", fa.FaArgumentError, ["lse"],
                    softmax_lse=self.lse.astype(np.float16))

    def test_gradient_of_the_wrong_shape_is_FA_ESHAPE(self):
        self.raises("FA_ESHAPE", fa.FaArgumentError, ["dq"],
                    dq=np.empty((1, 6, 4, 8), np.float32))
        self.raises("FA_ESHAPE", fa.FaArgumentError, ["dk"],
                    dk=np.empty((1, 9, 4, 16), np.float32))

    def test_dout_of_the_wrong_shape_or_dtype(self):
        self.raises("FA_ESHAPE", fa.FaArgumentError, ["dout"], dout=self.o[:, :5].copy())
        self.raises("FA_EDTYPE", fa.FaArgumentError, ["dout"],
                    dout=self.o.astype(np.float16))
        self.raises("FA_ESHAPE", fa.FaArgumentError, ["dout", "4"], dout=self.o[0])

    def test_outputs_overlapping_an_input_or_each_other_are_FA_EOVERLAP(self):
        c = self.c
        q = fa.empty_host(self.q.shape, "float32", client=c)
        q[...] = self.q
        o = fa.empty_host(self.o.shape, "float32", client=c)
        lse = fa.empty_host(self.lse.shape, "float32", client=c)
        fa.attn_fwd(q, q, q, out=o, lse=lse, client=c)
        dq = fa.empty_host(q.shape, "float32", client=c)
        self.raises("FA_EOVERLAP", fa.FaArgumentError, [], dout=o, q=q, k=q, v=q, out=o,
                    softmax_lse=lse, dq=q)
        self.raises("FA_EOVERLAP", fa.FaArgumentError, [], dout=o, q=q, k=q, v=q, out=o,
                    softmax_lse=lse, dq=dq, dk=dq)

    def test_read_only_gradient_is_FA_EINVAL(self):
        dq = np.empty_like(self.q)
        dq.flags.writeable = False
        self.raises("FA_EINVAL", fa.FaArgumentError, ["dq", "read-only"], dq=dq)

    def test_bad_layout_and_mask_are_FA_EINVAL(self):
        with self.assertRaises(fa.FaArgumentError) as cm:
            fa.attn_bwd(self.q, self.k, self.k, self.o, self.o, self.lse, layout="sbhd",
                        client=self.c)
        self.assertEqual(cm.exception.status, "FA_EINVAL")
        self.assertIn("bshd", cm.exception.detail)
        with self.assertRaises(fa.FaArgumentError) as cm:
            fa.attn_bwd(self.q, self.k, self.k, self.o, self.o, self.lse, mask=7,
                        client=self.c)
        self.assertIn("MASK_", cm.exception.detail)

    def test_head_dim_not_contiguous_in_shared_memory_is_refused_by_the_library(self):
        c = self.c
        wide = fa.empty_host((1, 6, 4, 32), "float32", client=c)
        wide[...] = 0.0
        with self.assertRaises(fa.FaError) as cm:
            self.bwd(dout=wide[..., ::2])
        self.assertIn(cm.exception.status, ("FA_ESHAPE", "FA_EINVAL"), str(cm.exception))
        self.assertIn("dout", cm.exception.detail)
        self.assertIn("contiguous", cm.exception.detail)


if __name__ == "__main__":
    unittest.main()
