"""Several processes through one daemon at once, each with its own client (a forward and its
backward per call); and the clear error in a child forked while a client was open (nanomsg does
not survive fork)."""
import multiprocessing as mp
import os
import unittest

from common import NO_NUMPY, TOL, np, rand, reference, reference_bwd, rel_err

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
