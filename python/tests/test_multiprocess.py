"""Several processes through one daemon at once, each with its own client (a forward and its
backward per call; the inference calls: varlen, a paged KV cache with an append, a windowed and
capped forward); and the clear error in a child forked while a client was open (nanomsg does not
survive fork)."""
import multiprocessing as mp
import os
import unittest

from common import NO_NUMPY, TOL, np, rand, reference, reference_bwd, rel_err
import infer_ref as R

if np is not None:
    import fa
    from fa_daemon import Daemon

PROCS, CALLS = 4, 6


def worker(url, seed):
    """Runs in a spawned process: CALLS checked forward and backward calls; returns the largest
    relative error."""
    import warnings
    import fa
    warnings.simplefilter("ignore", fa.FaCopyWarning)
    c = fa.Client(url)
    rng = np.random.default_rng(seed)
    worst = 0.0
    for i in range(CALLS):
        Sq, Sk = int(rng.integers(1, 40)), int(rng.integers(1, 40))
        q = fa.empty_host((2, Sq, 4, 32), "float32", client=c)
        q[...] = rand(rng, q.shape, "float32")
        k = rand(rng, (2, Sk, 2, 32), "float32")
        mask = "bottom_right" if i % 2 else "none"
        o, lse = fa.flash_attn_func(q, k, k, causal=bool(i % 2), return_lse=True, client=c)
        worst = max(worst, rel_err(o, reference(q, k, k, mask)[0]))
        dout = rand(rng, o.shape, "float32")
        grads = fa.flash_attn_backward(dout, q, k, k, o, lse, causal=bool(i % 2), client=c)
        for got, want in zip(grads, reference_bwd(q, k, k, dout, mask)):
            worst = max(worst, rel_err(got, want))
    c.close()
    return worst


def infer_worker(url, seed):
    """Runs in a spawned process: CALLS rounds of a ragged varlen batch, a paged KV cache that
    gets new tokens appended, and a windowed, capped dense forward, each checked against the
    float64 reference; returns the largest relative error."""
    import warnings
    import fa
    warnings.simplefilter("ignore", fa.FaCopyWarning)
    c = fa.Client(url)
    rng = np.random.default_rng(100 + seed)
    worst = 0.0
    Hq, Hkv, D, ps = 4, 2, 16, 16
    for i in range(CALLS):
        lens_q = [int(x) for x in rng.integers(0, 12, 3)]
        lens_k = [int(x) for x in rng.integers(1, 30, 3)]
        cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
        cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
        q = rand(rng, (max(int(cu_q[-1]), 1), Hq, D), "float32")
        k, v = (rand(rng, (int(cu_k[-1]), Hkv, D), "float32") for _ in range(2))
        w = (int(rng.integers(0, 8)), 0) if i % 2 else (-1, -1)
        o = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                      causal=bool(i % 2), window_size=w, client=c)
        n = int(cu_q[-1])
        worst = max(worst, rel_err(o[:n], R.varlen(q, k, v, cu_q, cu_k, bool(i % 2), w)[0][:n]))

        B, pages = 2, 8
        k_pool, v_pool = (rand(rng, (pages, ps, Hkv, D), "float32") for _ in range(2))
        bt = rng.permutation(pages)[:B * 3].reshape(B, 3).astype(np.int32)
        lens = np.array([int(x) for x in rng.integers(1, 30, B)], np.int32)
        qd = rand(rng, (B, 2, Hq, D), "float32")
        kn, vn = (rand(rng, (B, 2, Hkv, D), "float32") for _ in range(2))
        o = fa.flash_attn_with_kvcache(qd, k_pool, v_pool, kn, vn, cache_seqlens=lens,
                                       block_table=bt, causal=True, client=c)
        want = R.kvcache(qd, k_pool, v_pool, lens + 2, bt, causal=True)[0]
        worst = max(worst, rel_err(o, want))

        qs = rand(rng, (1, 20, Hq, D), "float32")
        ks = rand(rng, (1, 25, Hkv, D), "float32")
        o = fa.flash_attn_func(qs, ks, ks, causal=True, window_size=(6, 0), softcap=4.0,
                               client=c)
        worst = max(worst, rel_err(o, R.dense(qs, ks, ks, True, (6, 0), 4.0)[0]))
    c.close()
    return worst


@unittest.skipIf(np is None, NO_NUMPY)
class Processes(unittest.TestCase):
    def test_four_processes_at_once_get_correct_results(self):
        with Daemon() as d:
            ctx = mp.get_context("spawn")
            with ctx.Pool(PROCS) as pool:
                errs = pool.starmap(worker, [(d.url, s) for s in range(PROCS)])
        self.assertEqual(len(errs), PROCS)
        for e in errs:
            self.assertLessEqual(e, TOL["float32"])

    def test_four_processes_of_inference_calls_at_once_get_correct_results(self):
        with Daemon() as d:
            ctx = mp.get_context("spawn")
            with ctx.Pool(PROCS) as pool:
                errs = pool.starmap(infer_worker, [(d.url, s) for s in range(PROCS)])
        self.assertEqual(len(errs), PROCS)
        for e in errs:
            self.assertLessEqual(e, TOL["float32"])

    @unittest.skipUnless(hasattr(os, "fork"), "no os.fork here")
    def test_a_child_forked_with_an_open_client_gets_a_clear_error(self):
        with Daemon() as d:
            c = fa.Client(d.url)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # child: Python only, then _exit
                os.close(r)
                try:
                    fa.Client(d.url)
                    msg = b"opened"
                except fa.FaError as e:
                    msg = ("%s|%s" % (e.status, e.detail)).encode()
                os.write(w, msg)
                os._exit(0)
            os.close(w)
            got = os.read(r, 4096).decode()
            os.close(r)
            os.waitpid(pid, 0)
            c.ping()  # the parent's client is untouched
            c.close()
        status, _, detail = got.partition("|")
        self.assertEqual(status, "FA_ECLOSED", got)
        self.assertIn("spawn", detail)


if __name__ == "__main__":
    unittest.main()
