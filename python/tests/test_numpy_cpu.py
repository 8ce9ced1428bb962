"""NumPy arrays through a live fa-daemon (CPU backend) against the float64 reference: odd
shapes, GQA/MQA, both causal alignments, fp16/fp32 (bf16 with ml_dtypes), strided views, the
shared-memory arrays used in place, DLPack."""
import unittest
import warnings

from common import NO_NUMPY, TOL, lse_err, np, rand, reference, rel_err

if np is not None:
    import fa
    import fa._attn
    from fa_daemon import Daemon

# (B, Sq, Sk, Hq, Hkv, D)
SHAPES = [(1, 1, 1, 1, 1, 8), (2, 7, 13, 4, 2, 24), (1, 13, 7, 6, 3, 40),
          (3, 33, 65, 8, 1, 64), (1, 17, 17, 2, 2, 128), (2, 3, 70, 4, 4, 8)]


@unittest.skipIf(np is None, NO_NUMPY)
class NumpyOnCpuBackend(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        cls.c = fa.Client(cls.d.url)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.d.close()

    def check(self, got, want, dtype, what):
        e = rel_err(got, want)
        self.assertLessEqual(e, TOL[dtype], "%s: relative error %.3g" % (what, e))

    def test_flash_attn_func_matches_reference_over_shapes_masks_dtypes(self):
        rng = np.random.default_rng(1)
        for dtype in ("float32", "float16"):
            for B, Sq, Sk, Hq, Hkv, D in SHAPES:
                q = rand(rng, (B, Sq, Hq, D), dtype)
                k = rand(rng, (B, Sk, Hkv, D), dtype)
                v = rand(rng, (B, Sk, Hkv, D), dtype)
                for causal in (False, True):
                    what = "%s %s causal=%s" % (dtype, (B, Sq, Sk, Hq, Hkv, D), causal)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", fa.FaCopyWarning)
                        o, lse = fa.flash_attn_func(q, k, v, causal=causal, return_lse=True,
                                                    client=self.c)
                    ro, rl = reference(q, k, v, "bottom_right" if causal else "none")
                    self.assertEqual(o.shape, q.shape)
                    self.assertEqual(o.dtype, q.dtype)
                    self.assertEqual(lse.shape, (B, Hq, Sq))
                    self.assertEqual(lse.dtype, np.float32)
                    self.check(o, ro, dtype, what)
                    self.assertLessEqual(lse_err(lse, rl), 1e-3 if dtype == "float16"
                                         else 1e-5, what + ": lse")

    def test_sdpa_is_top_left_causal_in_bhsd(self):
        rng = np.random.default_rng(2)
        for B, Sq, Sk, Hq, Hkv, D in SHAPES:
            q = rand(rng, (B, Hq, Sq, D), "float32")
            k = rand(rng, (B, Hkv, Sk, D), "float32")
            v = rand(rng, (B, Hkv, Sk, D), "float32")
            for causal in (False, True):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", fa.FaCopyWarning)
                    o = fa.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                        scale=0.3, enable_gqa=True,
                                                        client=self.c)
                ro, _ = reference(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3),
                                  v.transpose(0, 2, 1, 3), "top_left" if causal else "none",
                                  scale=0.3)
                self.assertEqual(o.shape, q.shape)
                self.check(o.transpose(0, 2, 1, 3), ro, "float32",
                           "sdpa %s causal=%s" % ((B, Sq, Sk, Hq, Hkv, D), causal))

    def test_shared_memory_arrays_are_used_in_place_without_a_copy(self):
        rng = np.random.default_rng(3)
        B, S, H, D = 2, 19, 3, 32
        # One packed qkv buffer [B, S, 3, H, D] and BHSD views of it: strided, no copies.
        qkv = fa.empty_host((B, S, 3, H, D), "float16", client=self.c)
        qkv[...] = rand(rng, qkv.shape, "float16")
        out = fa.empty_host((B, S, H, D), "float16", client=self.c)
        q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
        self.assertTrue(fa.is_host_shared(q, client=self.c))
        fa._attn._warned.clear()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            o = fa.scaled_dot_product_attention(q, k, v, is_causal=True, client=self.c,
                                                out=out.transpose(0, 2, 1, 3))
        self.assertEqual([x for x in w if issubclass(x.category, fa.FaCopyWarning)], [])
        self.assertTrue(np.shares_memory(o, out))
        ro, _ = reference(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], "top_left")
        self.check(out, ro, "float16", "packed qkv in shared memory")

    def test_arrays_outside_shared_memory_are_copied_with_one_warning(self):
        rng = np.random.default_rng(4)
        big = rand(rng, (2, 11, 4, 80), "float32")
        q = big[:, :, :, 8:72]        # strided: head dim contiguous, row stride 80
        k = big[:, ::-1, :, :64]      # negative seq stride: copied
        v = np.ascontiguousarray(big[:, :, :, 16:80])
        fa._attn._warned.clear()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            o1 = fa.flash_attn_func(q, k, v, client=self.c)
            o2 = fa.flash_attn_func(q, k, v, client=self.c)
        copies = [x for x in w if issubclass(x.category, fa.FaCopyWarning)]
        self.assertEqual(len(copies), 1, [str(x.message) for x in copies])
        self.assertIn("fa.empty_host", str(copies[0].message))
        ro, _ = reference(q, k, v)
        self.check(o1, ro, "float32", "strided copies")
        np.testing.assert_array_equal(o1, o2)

    def test_out_argument_is_written_and_returned(self):
        rng = np.random.default_rng(5)
        q = rand(rng, (1, 9, 2, 16), "float32")
        out = np.full((1, 2, 9, 16), np.nan, dtype=np.float32).transpose(0, 2, 1, 3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fa.FaCopyWarning)
            o = fa.flash_attn_func(q, q, q, causal=True, out=out, client=self.c)
        self.assertIs(o, out)
        self.check(out, reference(q, q, q, "bottom_right")[0], "float32", "out=")

    def test_dlpack_objects_are_taken(self):
        rng = np.random.default_rng(6)

        class OnlyDlpack:  # a foreign array that speaks DLPack only
            def __init__(self, a):
                self.a = a

            def __dlpack__(self, stream=None):
                return self.a.__dlpack__()

            def __dlpack_device__(self):
                return self.a.__dlpack_device__()

        q = fa.empty_host((2, 5, 2, 8), "float32", client=self.c)
        q[...] = rand(rng, q.shape, "float32")
        out = fa.empty_host(q.shape, "float32", client=self.c)
        fa.flash_attn_func(OnlyDlpack(q), OnlyDlpack(q), OnlyDlpack(q), out=OnlyDlpack(out),
                           client=self.c)
        self.check(out, reference(q, q, q)[0], "float32", "DLPack")

    def test_bfloat16_through_ml_dtypes(self):
        try:
            import ml_dtypes
        except ImportError:
            self.skipTest("ml_dtypes is not installed (NumPy has no bfloat16 of its own)")
        rng = np.random.default_rng(7)
        q = rand(rng, (1, 12, 4, 64), "float32").astype(ml_dtypes.bfloat16)
        k = rand(rng, (1, 20, 2, 64), "float32").astype(ml_dtypes.bfloat16)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fa.FaCopyWarning)
            o = fa.flash_attn_func(q, k, k, causal=True, client=self.c)
        self.assertEqual(o.dtype, q.dtype)
        self.check(o.astype(np.float32), reference(q.astype(np.float32), k.astype(np.float32),
                                                   k.astype(np.float32), "bottom_right")[0],
                   "bfloat16", "bf16")

    def test_default_client_follows_fa_socket(self):
        import os
        from fa import _client
        old = os.environ.get("FA_SOCKET")
        os.environ["FA_SOCKET"] = self.d.url
        fa.set_default_client(None)
        try:
            q = fa.empty_host((1, 4, 1, 8), "float32")
            q[...] = 1.0
            o = fa.flash_attn_func(q, q, q)
            np.testing.assert_allclose(o, 1.0, rtol=1e-6)
            self.assertIs(fa.default_client(), _client._default)
        finally:
            if old is None:
                del os.environ["FA_SOCKET"]
            else:
                os.environ["FA_SOCKET"] = old
            del q, o
            fa.default_client().close()
            fa.set_default_client(None)


if __name__ == "__main__":
    unittest.main()
