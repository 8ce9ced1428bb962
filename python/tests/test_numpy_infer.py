"""The sliding window, softcap, variable-length and KV-cache calls from NumPy arrays through a
live fa-daemon (CPU backend) against the float64 reference of infer_ref.py: ragged batches with
lengths 1 and empty sequences, GQA/MQA, causal, windows (left, 0), one-sided and two-sided,
softcap; contiguous and paged caches (page sizes 16 and 32, shuffled block tables), the append
of new keys; the backward with a window and softcap; the errors with their status and detail,
nothing written by a refused append."""
import unittest
import warnings

from common import NO_NUMPY, np, rand, rel_err

if np is not None:
    import fa
    import infer_ref as R
    from fa_daemon import Daemon

TOL = {"float32": 1e-5, "float16": 3e-3}
WINDOWS = [(-1, -1), (3, 0), (0, 5), (-1, 2), (4, -1), (2, 2)]


def lse_close(tc, got, want, tol, what):
    got = np.asarray(got, dtype=np.float64)
    tc.assertTrue(np.array_equal(np.isneginf(got), np.isneginf(want)), what + ": -inf rows")
    f = np.isfinite(want)
    if f.any():
        tc.assertLess(np.abs(got[f] - want[f]).max(), tol, what + ": lse")


@unittest.skipIf(np is None, NO_NUMPY)
class InferenceOnCpuBackend(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        cls.c = fa.Client(cls.d.url)
        warnings.simplefilter("ignore", fa.FaCopyWarning)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.d.close()

    def check(self, got, want, tol, what):
        self.assertEqual(np.asarray(got).shape, want.shape, what)
        e = rel_err(got, want)
        self.assertLessEqual(e, tol, "%s: relative error %.3g" % (what, e))

    # ---- the dense forward's window and softcap --------------------------------------------
    def test_flash_attn_func_window_and_softcap_match_reference(self):
        rng = np.random.default_rng(31)
        for (B, Sq, Sk, Hq, Hkv, D) in ((2, 7, 13, 4, 2, 16), (1, 13, 7, 3, 1, 8),
                                        (1, 1, 29, 2, 2, 24)):
            q, k, v = (rand(rng, s, np.float32) for s in ((B, Sq, Hq, D), (B, Sk, Hkv, D),
                                                          (B, Sk, Hkv, D)))
            for causal in (False, True):
                for w in WINDOWS:
                    for cap in (0.0, 1.5):
                        what = "%s causal=%s window=%s softcap=%s" % (
                            (B, Sq, Sk, Hq, Hkv, D), causal, w, cap)
                        o, lse = fa.flash_attn_func(q, k, v, causal=causal, window_size=w,
                                                    softcap=cap, return_lse=True,
                                                    client=self.c)
                        wo, wl = R.dense(q, k, v, causal, w, cap)
                        self.check(o, wo, TOL["float32"], what)
                        lse_close(self, lse, wl, 1e-5, what)

    def test_causal_is_the_window_minus_one_zero(self):
        rng = np.random.default_rng(32)
        q, k, v = (rand(rng, (1, 9, 2, 8), np.float32) for _ in range(3))
        a = fa.flash_attn_func(q, k, v, causal=True, client=self.c)
        b = fa.flash_attn_func(q, k, v, window_size=(-1, 0), client=self.c)
        np.testing.assert_array_equal(a, b)

    def test_attn_fwd_window_aligns_top_left_under_the_top_left_mask(self):
        rng = np.random.default_rng(33)
        q = rand(rng, (1, 5, 2, 8), np.float32)
        k, v = (rand(rng, (1, 11, 2, 8), np.float32) for _ in range(2))
        o = fa.attn_fwd(q, k, v, mask=fa.MASK_CAUSAL_TOP_LEFT, window_size=(2, -1),
                        client=self.c)
        wo, _ = R.dense(q, k, v, True, (2, -1), top_left=True)
        self.check(o, wo, TOL["float32"], "top-left window")

    def test_backward_with_window_and_softcap_matches_finite_differences(self):
        rng = np.random.default_rng(34)
        B, Sq, Sk, Hq, Hkv, D = 1, 5, 8, 4, 2, 8
        q, k, v, do = (rng.standard_normal(s) for s in ((B, Sq, Hq, D), (B, Sk, Hkv, D),
                                                        (B, Sk, Hkv, D), (B, Sq, Hq, D)))
        for causal, w, cap in ((True, (3, 0), 0.0), (False, (2, 1), 2.0), (True, (-1, -1), 1.0)):
            f32 = [x.astype(np.float32) for x in (q, k, v, do)]
            o, lse = fa.flash_attn_func(*f32[:3], causal=causal, window_size=w, softcap=cap,
                                        return_lse=True, client=self.c)
            grads = fa.flash_attn_backward(f32[3], *f32[:3], o, lse, causal=causal,
                                           window_size=w, softcap=cap, client=self.c)
            xs = [x.astype(np.float64) for x in f32[:3]]
            for i, g in enumerate(grads):
                fd = np.zeros_like(xs[i])
                for idx in np.ndindex(xs[i].shape):
                    pm = []
                    for h in (1e-6, -1e-6):
                        args = [x.copy() for x in xs]
                        args[i][idx] += h
                        pm.append((R.dense(*args, causal, w, cap)[0] * f32[3]).sum())
                    fd[idx] = (pm[0] - pm[1]) / 2e-6
                self.check(g, fd, 1e-4, "d%s causal=%s window=%s softcap=%s"
                           % ("qkv"[i], causal, w, cap))

    # ---- varlen ----------------------------------------------------------------------------
    def varlen_case(self, rng, lens_q, lens_k, Hq, Hkv, D, dtype="float32", pad=0):
        cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
        cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
        tq, tk = int(cu_q[-1]) + pad, int(cu_k[-1])
        q = rand(rng, (max(tq, 1), Hq, D), dtype)
        k, v = (rand(rng, (max(tk, 1), Hkv, D), dtype) for _ in range(2))
        return q, k, v, cu_q, cu_k

    def test_varlen_matches_reference_over_ragged_batches(self):
        rng = np.random.default_rng(35)
        cases = [([1], [1], 1, 1, 8), ([3, 1, 7], [5, 1, 9], 4, 2, 16),
                 ([4, 0, 2], [4, 3, 0], 2, 2, 8),  # an empty query and an empty key sequence
                 ([17, 1, 33], [17, 40, 12], 6, 1, 24), ([5, 5], [2, 9], 3, 3, 40)]
        for lens_q, lens_k, Hq, Hkv, D in cases:
            for dtype in ("float32", "float16"):
                q, k, v, cu_q, cu_k = self.varlen_case(rng, lens_q, lens_k, Hq, Hkv, D, dtype)
                for causal, w, cap in ((False, (-1, -1), 0.0), (True, (-1, -1), 0.0),
                                       (True, (3, 0), 0.0), (False, (2, 4), 0.0),
                                       (False, (-1, -1), 2.5), (True, (5, -1), 1.0)):
                    what = "%s %s %s causal=%s window=%s softcap=%s" % (
                        lens_q, lens_k, dtype, causal, w, cap)
                    o, lse = fa.flash_attn_varlen_func(
                        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                        window_size=w, softcap=cap, return_lse=True, client=self.c)
                    wo, wl = R.varlen(q, k, v, cu_q, cu_k, causal, w, cap)
                    n = cu_q[-1]
                    self.assertEqual(lse.shape, (Hq, q.shape[0]), what)
                    self.check(o[:n], wo[:n], TOL[dtype], what)
                    lse_close(self, lse[:, :n], wl[:, :n], 1e-3 if dtype == "float16" else
                              1e-5, what)

    def test_varlen_padding_rows_and_max_seqlen_none_and_attn_probs(self):
        rng = np.random.default_rng(36)
        q, k, v, cu_q, cu_k = self.varlen_case(rng, [2, 3], [4, 4], 2, 1, 8, pad=3)
        out = np.full(q.shape, 7.0, np.float32)
        o, lse, p = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, None, 0,
                                              return_attn_probs=True, out=out, client=self.c)
        self.assertIs(o, out)
        self.assertIsNone(p)
        self.assertTrue((o[5:] == 7.0).all(), "padding rows are not written")
        wo, _ = R.varlen(q, k, v, cu_q, cu_k)
        self.check(o[:5], wo[:5], TOL["float32"], "padded")

    # ---- KV cache ----------------------------------------------------------------------------
    def paged_cache(self, rng, B, ps, max_pages, Hkv, D, dtype, spare=3):
        pages = B * max_pages + spare
        k_pool, v_pool = (rand(rng, (pages, ps, Hkv, D), dtype) for _ in range(2))
        bt = rng.permutation(pages)[:B * max_pages].reshape(B, max_pages).astype(np.int32)
        return k_pool, v_pool, bt

    def test_kvcache_contiguous_and_paged_match_reference(self):
        rng = np.random.default_rng(37)
        B, Hq, Hkv, D = 3, 4, 2, 16
        lens = np.array([1, 40, 17], np.int32)
        for Sq in (1, 3):
            q = rand(rng, (B, Sq, Hq, D), np.float32)
            kc, vc = (rand(rng, (B, 64, Hkv, D), np.float32) for _ in range(2))
            for ps in (16, 32):
                kp, vp, bt = self.paged_cache(rng, B, ps, 64 // ps, Hkv, D, np.float32)
                for causal, w, cap in ((False, (-1, -1), 0.0), (True, (-1, -1), 0.0),
                                       (True, (7, 0), 0.0), (False, (-1, -1), 3.0)):
                    what = "Sq=%d ps=%d causal=%s window=%s softcap=%s" % (Sq, ps, causal, w,
                                                                           cap)
                    o, lse = fa.flash_attn_with_kvcache(
                        q, kc, vc, cache_seqlens=lens, causal=causal, window_size=w,
                        softcap=cap, return_softmax_lse=True, client=self.c)
                    wo, wl = R.kvcache(q, kc, vc, lens, None, causal, w, cap)
                    self.check(o, wo, TOL["float32"], "contiguous " + what)
                    lse_close(self, lse, wl, 1e-5, "contiguous " + what)
                    o, lse = fa.flash_attn_with_kvcache(
                        q, kp, vp, cache_seqlens=lens, block_table=bt, causal=causal,
                        window_size=w, softcap=cap, return_softmax_lse=True, client=self.c)
                    wo, wl = R.kvcache(q, kp, vp, lens, bt, causal, w, cap)
                    self.check(o, wo, TOL["float32"], "paged " + what)
                    lse_close(self, lse, wl, 1e-5, "paged " + what)

    def test_kvcache_an_int_length_and_none_for_the_whole_cache(self):
        rng = np.random.default_rng(38)
        q = rand(rng, (2, 2, 2, 8), np.float32)
        kc, vc = (rand(rng, (2, 20, 1, 8), np.float32) for _ in range(2))
        o = fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=9, client=self.c)
        self.check(o, R.kvcache(q, kc, vc, [9, 9])[0], TOL["float32"], "int length")
        o = fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=np.int32(4), client=self.c)
        self.check(o, R.kvcache(q, kc, vc, [4, 4])[0], TOL["float32"], "NumPy int length")
        o = fa.flash_attn_with_kvcache(q, kc, vc, causal=True, client=self.c)
        self.check(o, R.kvcache(q, kc, vc, [20, 20], causal=True)[0], TOL["float32"], "None")

    def test_kvcache_append_then_attend(self):
        rng = np.random.default_rng(39)
        B, Hq, Hkv, D = 3, 4, 1, 8
        lens = np.array([0, 15, 30], np.int32)
        for Snew in (1, 4):
            q = rand(rng, (B, Snew, Hq, D), np.float32)
            kn, vn = (rand(rng, (B, Snew, Hkv, D), np.float32) for _ in range(2))
            # contiguous
            kc, vc = (rand(rng, (B, 40, Hkv, D), np.float32) for _ in range(2))
            k0, v0 = kc.copy(), vc.copy()
            o = fa.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True,
                                           client=self.c)
            for b in range(B):
                np.testing.assert_array_equal(kc[b, lens[b]:lens[b] + Snew], kn[b])
                np.testing.assert_array_equal(vc[b, lens[b]:lens[b] + Snew], vn[b])
                np.testing.assert_array_equal(kc[b, :lens[b]], k0[b, :lens[b]])
                np.testing.assert_array_equal(kc[b, lens[b] + Snew:], k0[b, lens[b] + Snew:])
                np.testing.assert_array_equal(vc[b, :lens[b]], v0[b, :lens[b]])
            np.testing.assert_array_equal(lens, [0, 15, 30])  # not updated, as FlashAttention
            self.check(o, R.kvcache(q, kc, vc, lens + Snew, causal=True)[0], TOL["float32"],
                       "contiguous append Snew=%d" % Snew)
            # paged, across a page boundary (15 + 4 crosses 16)
            for ps in (16, 32):
                kp, vp, bt = self.paged_cache(rng, B, ps, 64 // ps, Hkv, D, np.float32)
                kp0 = kp.copy()
                o = fa.flash_attn_with_kvcache(q, kp, vp, kn, vn, cache_seqlens=lens,
                                               block_table=bt, causal=True, client=self.c)
                for b in range(B):
                    for t in range(Snew):
                        j = lens[b] + t
                        np.testing.assert_array_equal(kp[bt[b][j // ps], j % ps], kn[b, t])
                        np.testing.assert_array_equal(vp[bt[b][j // ps], j % ps], vn[b, t])
                self.assertEqual(int((kp != kp0).any(axis=(2, 3)).sum()), B * Snew)
                self.check(o, R.kvcache(q, kp, vp, lens + Snew, bt, causal=True)[0],
                           TOL["float32"], "paged append ps=%d Snew=%d" % (ps, Snew))

    # ---- errors --------------------------------------------------------------------------------
    def assertStatus(self, cm, status, cls, detail_has=None):
        e = cm.exception
        self.assertIsInstance(e, cls)
        self.assertEqual(e.status, status, str(e))
        if detail_has is not None:
            self.assertIn(detail_has, e.detail)

    def test_varlen_errors(self):
        q = np.zeros((6, 2, 8), np.float32)
        cu = np.array([0, 2, 6], np.int32)
        with self.assertRaises(fa.FaError) as cm:
            fa.flash_attn_varlen_func(q, q, q, cu.astype(np.int64), cu, 4, 4, client=self.c)
        self.assertStatus(cm, "FA_EDTYPE", fa.FaArgumentError, "int32")
        with self.assertRaises(fa.FaError) as cm:
            fa.flash_attn_varlen_func(q[None], q, q, cu, cu, 4, 4, client=self.c)
        self.assertStatus(cm, "FA_ESHAPE", fa.FaArgumentError, "total_tokens")
        with self.assertRaises(fa.FaError) as cm:
            fa.flash_attn_varlen_func(q, q, q, cu, cu[:2], 4, 4, client=self.c)
        self.assertStatus(cm, "FA_ESHAPE", fa.FaArgumentError, "batch + 1")
        bad = np.array([0, 4, 3], np.int32)  # decreasing: the daemon's check and detail
        with self.assertRaises(fa.FaError) as cm:
            fa.flash_attn_varlen_func(q, q, q, bad, cu, 0, 0, client=self.c)
        self.assertStatus(cm, "FA_EINVAL", fa.FaArgumentError, "cu_seqlens_q[2]")
        with self.assertRaises(fa.FaError) as cm:
            fa.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, dropout_p=0.1, client=self.c)
        self.assertStatus(cm, "FA_ENOTSUP", fa.FaNotSupportedError, "dropout")
        with self.assertRaises(fa.FaError) as cm:
            fa.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, block_table=cu, client=self.c)
        self.assertStatus(cm, "FA_ENOTSUP", fa.FaNotSupportedError, "flash_attn_with_kvcache")
        with self.assertRaises(fa.FaError) as cm:
            fa.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, window_size=(1,), client=self.c)
        self.assertStatus(cm, "FA_EINVAL", fa.FaArgumentError, "window_size")

    def test_async_inference_calls_refuse_what_they_cannot_order(self):
        """stream= asks for fa_attn_varlen_async / fa_attn_kvcache_async: host (NumPy) arrays
        are refused with the reason before anything is sent, so is a KV-cache call whose
        lengths would be read on the host (an int, None, or an append); stream=None still
        computes."""
        rng = np.random.default_rng(41)
        q = rand(rng, (6, 2, 8), np.float32)
        cu = np.array([0, 2, 6], np.int32)
        with self.assertRaises(fa.FaError) as cm:
            fa.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, client=self.c, stream=12345)
        self.assertStatus(cm, "FA_EINVAL", fa.FaArgumentError, "host buffer")
        with self.assertRaises(fa.FaError) as cm:
            fa.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, client=self.c, stream="current")
        self.assertStatus(cm, "FA_EINVAL", fa.FaArgumentError, "PyTorch")
        fa.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, client=self.c, stream=None)
        qk = rand(rng, (2, 1, 2, 8), np.float32)
        kp, vp, bt = self.paged_cache(rng, 2, 16, 2, 1, 8, np.float32, spare=0)
        lens = np.array([3, 5], np.int32)
        for kw in (dict(cache_seqlens=4), dict(cache_seqlens=None),
                   dict(cache_seqlens=lens, k=qk[:, :, :1], v=qk[:, :, :1])):
            with self.assertRaises(fa.FaError) as cm:
                fa.flash_attn_with_kvcache(qk, kp, vp, block_table=bt, client=self.c,
                                           stream=7, **kw)
            self.assertStatus(cm, "FA_EINVAL", fa.FaArgumentError, "stream order")
        with self.assertRaises(fa.FaError) as cm:
            fa.flash_attn_with_kvcache(qk, kp, vp, cache_seqlens=lens, block_table=bt,
                                       client=self.c, stream=7)
        self.assertStatus(cm, "FA_EINVAL", fa.FaArgumentError, "host buffer")

    def test_kvcache_errors_write_nothing(self):
        rng = np.random.default_rng(40)
        q = rand(rng, (2, 1, 2, 8), np.float32)
        kn, vn = (rand(rng, (2, 1, 1, 8), np.float32) for _ in range(2))
        kp, vp, bt = self.paged_cache(rng, 2, 16, 2, 1, 8, np.float32, spare=0)
        kp0, vp0 = kp.copy(), vp.copy()
        lens = np.array([3, 5], np.int32)
        cases = [
            (dict(cache_seqlens=lens.astype(np.int64), block_table=bt), "FA_EDTYPE", "int32"),
            (dict(cache_seqlens=lens, block_table=bt.astype(np.int64)), "FA_EDTYPE", "int32"),
            (dict(cache_seqlens=lens[:1], block_table=bt), "FA_ESHAPE", "cache_seqlens"),
            (dict(cache_seqlens=lens, block_table=bt[:1]), "FA_ESHAPE", "block_table"),
            (dict(cache_seqlens=lens, block_table=bt[:, 0]), "FA_ESHAPE", "block_table"),
            (dict(cache_seqlens=np.array([3, 32], np.int32), block_table=bt), "FA_EINVAL",
             "cache_seqlens[1] = 32 plus 1 new"),
            (dict(cache_seqlens=np.array([-1, 2], np.int32), block_table=bt), "FA_EINVAL",
             "cache_seqlens[0] = -1"),
            (dict(cache_seqlens=lens, block_table=np.array([[0, 1], [99, 2]], np.int32)),
             "FA_EINVAL", "block_table[1][0] = 99"),
            (dict(cache_seqlens=lens, block_table=bt, k=kn[:, :, :, :4], v=vn), "FA_ESHAPE",
             "new tokens"),
            (dict(cache_seqlens=lens, block_table=bt, k=kn.astype(np.float16), v=vn),
             "FA_EDTYPE", "float16"),
            (dict(cache_seqlens=lens, block_table=bt, k=kn, v=None), "FA_EINVAL", "both"),
            (dict(block_table=bt), "FA_EINVAL", "cache_seqlens"),
        ]
        for kw, status, detail in cases:
            kw = dict(kw)
            kw.setdefault("k", kn)
            kw.setdefault("v", vn)
            with self.assertRaises(fa.FaError, msg=repr(kw.keys())) as cm:
                fa.flash_attn_with_kvcache(q, kp, vp, client=self.c, **kw)
            self.assertStatus(cm, status, fa.FaArgumentError, detail)
            np.testing.assert_array_equal(kp, kp0)
            np.testing.assert_array_equal(vp, vp0)
        small = rand(rng, (4, 8, 1, 8), np.float32)  # page size 8: below fa's 16
        with self.assertRaises(fa.FaError) as cm:
            fa.flash_attn_with_kvcache(q, small, small.copy(), kn, vn, cache_seqlens=lens,
                                       block_table=np.zeros((2, 2), np.int32), client=self.c)
        self.assertStatus(cm, "FA_ESHAPE", fa.FaArgumentError, "page size 8")
        q12 = rand(rng, (2, 1, 2, 12), np.float32)  # head dim 12: refused before the append
        k12, v12 = (rand(rng, (2, 16, 1, 12), np.float32) for _ in range(2))
        k12_0 = k12.copy()
        with self.assertRaises(fa.FaError) as cm:
            fa.flash_attn_with_kvcache(q12, k12, v12, k12[:, :1].copy(), v12[:, :1].copy(),
                                       cache_seqlens=lens, client=self.c)
        self.assertStatus(cm, "FA_ESHAPE", fa.FaArgumentError, "head dim 12")
        np.testing.assert_array_equal(k12, k12_0)
        ro = kp.copy()
        ro.flags.writeable = False
        with self.assertRaises(fa.FaError) as cm:
            fa.flash_attn_with_kvcache(q, ro, vp, kn, vn, cache_seqlens=lens, block_table=bt,
                                       client=self.c)
        self.assertStatus(cm, "FA_EINVAL", fa.FaArgumentError, "read-only")
        with self.assertRaises(fa.FaError) as cm:
            fa.flash_attn_with_kvcache(q, kp, vp, rotary_cos=q, cache_seqlens=lens,
                                       client=self.c)
        self.assertStatus(cm, "FA_ENOTSUP", fa.FaNotSupportedError, "rotary")
        # a page index the daemon finds bad (no append): its detail names the entry
        with self.assertRaises(fa.FaError) as cm:
            fa.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=lens,
                                       block_table=np.array([[0, 1], [77, 2]], np.int32),
                                       client=self.c)
        self.assertStatus(cm, "FA_EINVAL", fa.FaArgumentError, "page_table[1][0] = 77")


if __name__ == "__main__":
    unittest.main()
