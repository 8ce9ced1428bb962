"""Errors become FaError subclasses carrying the status name and the daemon's detail; the
arguments fa does not support are refused, never ignored; a daemon restart is survived."""
import pickle
import unittest
import warnings

from common import NO_NUMPY, np, rand, reference, rel_err

if np is not None:
    import fa
    import fa._fast
    from fa_daemon import Daemon


@unittest.skipIf(np is None, NO_NUMPY)
class Errors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        cls.c = fa.Client(cls.d.url)
        warnings.simplefilter("ignore", fa.FaCopyWarning)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.d.close()

    def call(self, q, k, v, **kw):
        return fa.flash_attn_func(q, k, v, client=self.c, **kw)

    def assertStatus(self, cm, status, cls, detail_has=None):
        e = cm.exception
        self.assertIsInstance(e, cls)
        self.assertIsInstance(e, fa.FaError)
        self.assertEqual(e.status, status, str(e))
        if detail_has is not None:
            self.assertIn(detail_has, e.detail)
            self.assertIn(status, str(e))

    def test_head_dim_not_a_multiple_of_8_is_FA_ESHAPE_with_the_detail(self):
        q = np.zeros((1, 4, 2, 12), np.float32)
        with self.assertRaises(ValueError) as cm:
            self.call(q, q, q)
        self.assertStatus(cm, "FA_ESHAPE", fa.FaArgumentError)
        self.assertTrue(cm.exception.detail, "the daemon's detail text is carried")
        self.assertIn("12", cm.exception.detail)

    def test_heads_not_a_multiple_is_FA_ESHAPE(self):
        q = np.zeros((1, 4, 3, 8), np.float32)
        k = np.zeros((1, 4, 2, 8), np.float32)
        with self.assertRaises(fa.FaError) as cm:
            self.call(q, k, k)
        self.assertStatus(cm, "FA_ESHAPE", fa.FaArgumentError)
        self.assertTrue(cm.exception.detail)

    def test_sdpa_needs_enable_gqa_for_unequal_heads(self):
        q = np.zeros((1, 4, 3, 8), np.float32)
        k = np.zeros((1, 2, 3, 8), np.float32)
        with self.assertRaises(fa.FaError) as cm:
            fa.scaled_dot_product_attention(q, k, k, client=self.c)
        self.assertStatus(cm, "FA_ESHAPE", fa.FaArgumentError, "enable_gqa")

    def test_attn_mask_and_dropout_are_refused(self):
        q = np.zeros((1, 2, 3, 8), np.float32)
        with self.assertRaises(NotImplementedError) as cm:
            fa.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((3, 3), bool),
                                            client=self.c)
        self.assertStatus(cm, "FA_ENOTSUP", fa.FaNotSupportedError, "attn_mask")
        with self.assertRaises(fa.FaNotSupportedError) as cm:
            fa.scaled_dot_product_attention(q, q, q, dropout_p=0.1, client=self.c)
        self.assertIn("dropout_p", cm.exception.detail)

    def test_bad_window_size_and_softcap_are_FA_EINVAL(self):
        q = np.zeros((1, 2, 3, 8), np.float32)
        for w in ((4,), (4, -2), "ab", (1.5, 0), None):
            with self.assertRaises(fa.FaError, msg=repr(w)) as cm:
                self.call(q, q, q, window_size=w)
            self.assertStatus(cm, "FA_EINVAL", fa.FaArgumentError, "window_size")
        for cap in (-1.0, float("nan"), float("inf"), "x"):
            with self.assertRaises(fa.FaError, msg=repr(cap)) as cm:
                self.call(q, q, q, softcap=cap)
            self.assertStatus(cm, "FA_EINVAL", fa.FaArgumentError, "softcap")

    def test_wrong_rank_dtype_mismatch_and_float64(self):
        q3 = np.zeros((2, 3, 8), np.float32)
        with self.assertRaises(fa.FaError) as cm:
            self.call(q3, q3, q3)
        self.assertStatus(cm, "FA_ESHAPE", fa.FaArgumentError, "4")
        q = np.zeros((1, 2, 3, 8), np.float32)
        with self.assertRaises(fa.FaError) as cm:
            self.call(q, q.astype(np.float16), q)
        self.assertStatus(cm, "FA_EDTYPE", fa.FaArgumentError, "float16")
        with self.assertRaises(fa.FaError) as cm:
            self.call(q.astype(np.float64), q, q)
        self.assertStatus(cm, "FA_EDTYPE", fa.FaArgumentError, "float64")

    def test_output_overlapping_an_input_is_FA_EOVERLAP(self):
        q = fa.empty_host((1, 4, 2, 8), "float32", client=self.c)
        q[...] = 0.5
        with self.assertRaises(fa.FaError) as cm:
            self.call(q, q, q, out=q)
        self.assertStatus(cm, "FA_EOVERLAP", fa.FaArgumentError)
        self.assertTrue(cm.exception.detail)

    def test_read_only_out_is_refused(self):
        q = np.zeros((1, 2, 3, 8), np.float32)
        out = np.zeros_like(q)
        out.flags.writeable = False
        with self.assertRaises(fa.FaError) as cm:
            self.call(q, q, q, out=out)
        self.assertStatus(cm, "FA_EINVAL", fa.FaArgumentError, "read-only")

    def test_no_daemon_is_FA_EUNAVAIL(self):
        with self.assertRaises(ConnectionError) as cm:
            fa.Client("ipc:///nonexistent/fa-python-test.sock")
        self.assertStatus(cm, "FA_EUNAVAIL", fa.FaUnavailableError)

    def test_closed_client_is_FA_ECLOSED(self):
        c = fa.Client(self.d.url)
        c.close()
        c.close()
        with self.assertRaises(fa.FaError) as cm:
            c.ping()
        self.assertEqual(cm.exception.status, "FA_ECLOSED")

    def test_close_keeps_shared_arrays_mapped_until_they_are_gone(self):
        c = fa.Client(self.d.url)
        a = fa.empty_host((4, 8), "float32", client=c)
        a[...] = 3.0
        c.close()
        with self.assertRaises(fa.FaError) as cm:
            c.ping()
        self.assertEqual(cm.exception.status, "FA_ECLOSED")
        self.assertTrue(c._c, "the session stays while an array lives")
        self.assertEqual(float(a.sum()), 96.0)  # still mapped
        del a
        self.assertFalse(c._c, "closed with the last array")

    def test_errors_pickle_with_status_and_detail(self):
        e = fa._errors.usage("FA_ERANGE", "q: extent ends at byte 4160")
        e2 = pickle.loads(pickle.dumps(e))
        self.assertIs(type(e2), fa.FaArgumentError)
        self.assertEqual((e2.status, e2.detail, e2.code), ("FA_ERANGE", e.detail, 13))


@unittest.skipIf(np is None, NO_NUMPY)
class Restart(unittest.TestCase):
    def test_a_call_after_a_daemon_restart_reconnects_and_registers_again(self):
        d = Daemon()
        sock = d.sock
        c = fa.Client(d.url)
        rng = np.random.default_rng(9)
        q = fa.empty_host((1, 6, 2, 16), "float32", client=c)
        q[...] = rand(rng, q.shape, "float32")
        out = fa.empty_host(q.shape, "float32", client=c)
        fa.flash_attn_func(q, q, q, out=out, client=c)
        epoch = c.epoch
        d.stop()
        d2 = Daemon(sock=sock)
        try:
            out[...] = np.nan
            hits = fa._fast.hits
            fa.flash_attn_func(q, q, q, out=out, client=c)  # FA_ESESSION, reconnect, retry
            self.assertEqual(fa._fast.hits, hits + 1, "the prepared call reconnected and "
                             "was retried (the fast path's own FA_ESESSION handling)")
            self.assertNotEqual(c.epoch, epoch)
            self.assertLessEqual(rel_err(out, reference(q, q, q)[0]), 1e-5)
        finally:
            c.close()
            d2.close()
            d.close()


if __name__ == "__main__":
    unittest.main()
