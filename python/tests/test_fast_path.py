"""The fast path (fa/_fast.py): a call like an earlier one reuses that call's argument block,
prepared in the library (fa_prepare), giving only where the memory is (an fa_placement for
fa_prepared_call, which patches the block). It must never send a stale buffer, offset, shape or
stride: every block it sends (the prepared block patched with the placement's buffers and
offsets, as client/fa_prepared.c patches it; tests/integ/test_prepared.c checks that the
library's patched call writes the direct call's bytes) is compared byte for byte with the one
the full path builds for the same arrays (fa._fast off), and results with the float64 reference.

Host arrays through a live daemon (CPU backend): NumPy, and PyTorch CPU tensors when PyTorch is
installed (skipped with the reason otherwise). Device arrays without a GPU: a fake driver whose
"device memory" is host memory (allocations, buffer ids, frees and reuse at the same address
under the test's control), registrations and the library's attention call stubbed (the stub
checks the block and writes a known output), so the registration-cache decisions run as they
do on a GPU host.
"""
import ctypes as C
import struct
import unittest
import unittest.mock

from common import NO_NUMPY, TOL, np, rand, reference, rel_err

if np is not None:
    import fa
    import fa._attn
    import fa._fast
    from fa_daemon import Daemon

try:
    import torch
except ImportError:
    torch = None
NO_TORCH = "PyTorch is not installed (optional: the NumPy cases cover the same logic)"

FWD_BYTES = None if np is None else C.sizeof(fa._abi.fa_attn_fwd_args)
BWD_BYTES = None if np is None else C.sizeof(fa._abi.fa_attn_bwd_args)


def patched_block(c, p):
    """The block plan p's fa_prepared_call sends for the placement the fast path just wrote:
    its prepared bytes with each tensor's (buffer, address - the buffer's data) written in, as
    client/fa_prepared.c writes them."""
    pl = fa._abi.fa_placement.from_buffer(p.place)
    blk = bytearray(p.block)
    for i, field in enumerate(p.fields):
        buf, addr = pl.buf[i], pl.addr[i]
        struct.pack_into("<QQ", blk, field, buf, addr - c._lib.fa_buffer_data(buf))
    return bytes(blk)


class Recorder:
    """Wraps a client's _call and _call_prepared: records every block sent (the struct's
    bytes), then calls."""

    def __init__(self, c):
        self.c, self.blocks = c, []
        self.real, self.real_prepared = c._call, c._call_prepared

    def __enter__(self):
        def rec(fn, *args, what=None):
            name = getattr(fn, "__name__", "")
            if name.startswith("fa_attn_"):
                n = BWD_BYTES if "bwd" in name else FWD_BYTES
                self.blocks.append(C.string_at(args[0], n))
            return self.real(fn, *args, what=what)

        def rec_prepared(p):  # a place the library refused sent nothing: not recorded
            n = BWD_BYTES if len(p.fields) > 5 else FWD_BYTES
            blk = patched_block(self.c, p)[:n]
            st = self.real_prepared(p)
            if st != -1:
                self.blocks.append(blk)
            return st
        self.c._call = rec
        self.c._call_prepared = rec_prepared
        return self

    def __exit__(self, *e):
        del self.c._call
        del self.c._call_prepared


def sent(c, fn):
    """The block fn() sends with the fast path, and the one the full path sends, as bytes."""
    with Recorder(c) as r:
        fa._fast.enabled = True
        fn()
        fa._fast.enabled = False
        fn()
        fa._fast.enabled = True
    return r.blocks


@unittest.skipIf(np is None, NO_NUMPY)
class FastPathOnHostArrays(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        cls.c = fa.Client(cls.d.url)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.d.close()

    def setUp(self):
        fa._fast.enabled = True
        self.rng = np.random.default_rng(7)

    def shm(self, shape, dtype="float32"):
        x = fa.empty_host(shape, dtype, client=self.c)
        x[...] = rand(self.rng, shape, dtype)
        return x

    def call_twice_same_block(self, fn, what):
        fn()  # builds the plan
        before = fa._fast.hits
        fast, full = sent(self.c, fn)
        self.assertEqual(fa._fast.hits, before + 1, what + ": the repeat is served by a plan")
        self.assertEqual(fast, full, what + ": the fast block differs from the full path's")

    def test_a_repeated_call_is_served_by_a_plan_with_the_full_paths_block(self):
        q, k, v = self.shm((2, 9, 4, 16)), self.shm((2, 11, 2, 16)), self.shm((2, 11, 2, 16))
        o = fa.empty_host((2, 9, 4, 16), "float32", client=self.c)
        lse = fa.empty_host((2, 4, 9), "float32", client=self.c)
        self.call_twice_same_block(lambda: fa.attn_fwd(q, k, v, out=o, lse=lse,
                                                       mask=fa.MASK_CAUSAL_BOTTOM_RIGHT,
                                                       scale=0.3, client=self.c), "forward")
        ro, rl = reference(q, k, v, "bottom_right", 0.3)
        self.assertLessEqual(rel_err(o, ro), TOL["float32"])

    def test_shape_changes_on_the_same_memory_use_their_own_block(self):
        big_q = self.shm((1, 64, 2, 16))
        o = fa.empty_host((1, 64, 2, 16), "float32", client=self.c)
        for S in (64, 33, 64, 1, 33):  # views of one buffer: the same address each time
            q, out = big_q[:, :S], o[:, :S]
            fa.flash_attn_func(q, q, q, out=out, client=self.c)
            self.assertLessEqual(rel_err(out, reference(q, q, q)[0]), TOL["float32"], S)
            fast, full = sent(self.c, lambda: fa.flash_attn_func(q, q, q, out=out,
                                                                 client=self.c))
            self.assertEqual(fast, full, "S=%d" % S)

    def test_stride_changes_with_the_same_shape_use_their_own_block(self):
        base = self.shm((1, 8, 3, 2, 16))  # a packed [B, S, 3, H, D] buffer
        dense = self.shm((1, 8, 2, 16))
        o = fa.empty_host((1, 8, 2, 16), "float32", client=self.c)
        for q in (dense, base[:, :, 0], base[:, :, 1], dense, base[:, :, 2]):
            fa.flash_attn_func(q, q, q, out=o, client=self.c)
            self.assertLessEqual(rel_err(o, reference(q, q, q)[0]), TOL["float32"])
            fast, full = sent(self.c, lambda: fa.flash_attn_func(q, q, q, out=o,
                                                                 client=self.c))
            self.assertEqual(fast, full, q.strides)

    def test_a_freed_buffer_is_never_used_from_a_plan(self):
        q = self.shm((1, 4, 1, 8))
        o = fa.empty_host((1, 4, 1, 8), "float32", client=self.c)
        fa.flash_attn_func(q, q, q, out=o, client=self.c)
        before = fa._fast.hits
        want = reference(q, q, q)[0]
        del q, o  # both buffers freed: a plan keyed like them must find them gone
        q = self.shm((1, 4, 1, 8))
        o = fa.empty_host((1, 4, 1, 8), "float32", client=self.c)
        fast, full = sent(self.c, lambda: fa.flash_attn_func(q, q, q, out=o, client=self.c))
        self.assertEqual(fast, full)
        self.assertLessEqual(rel_err(o, reference(q, q, q)[0]), TOL["float32"])
        self.assertGreater(rel_err(want, reference(q, q, q)[0]), 0.0)  # other inputs
        self.assertLessEqual(fa._fast.hits, before + 1)

    def test_an_array_outside_shared_memory_with_a_planned_signature_is_staged(self):
        q = self.shm((1, 5, 2, 8))
        o = fa.empty_host((1, 5, 2, 8), "float32", client=self.c)
        fa.flash_attn_func(q, q, q, out=o, client=self.c)
        plain = np.array(q)  # same shape, strides and dtype, ordinary memory
        out = np.empty_like(plain)
        before = fa._fast.hits
        with unittest.mock.patch("warnings.warn"):
            fa.flash_attn_func(plain, plain, plain, out=out, client=self.c)
        self.assertEqual(fa._fast.hits, before, "a staged call is never a plan's")
        self.assertLessEqual(rel_err(out, reference(q, q, q)[0]), TOL["float32"])

    def test_a_read_only_out_is_refused_after_a_writeable_one_was_planned(self):
        q = self.shm((1, 3, 1, 8))
        o = fa.empty_host((1, 3, 1, 8), "float32", client=self.c)
        fa.flash_attn_func(q, q, q, out=o, client=self.c)
        fa.flash_attn_func(q, q, q, out=o, client=self.c)
        ro = o.view()
        ro.flags.writeable = False
        with self.assertRaises(fa.FaError) as e:
            fa.flash_attn_func(q, q, q, out=ro, client=self.c)
        self.assertEqual(e.exception.status, "FA_EINVAL")

    def test_the_backward_repeats_through_a_plan_with_the_full_paths_block(self):
        shape = (1, 6, 2, 8)
        q, k, v, dout = (self.shm(shape) for _ in range(4))
        o = fa.empty_host(shape, "float32", client=self.c)
        lse = fa.empty_host((1, 2, 6), "float32", client=self.c)
        fa.attn_fwd(q, k, v, out=o, lse=lse, client=self.c)
        dq, dk, dv = (fa.empty_host(shape, "float32", client=self.c) for _ in range(3))
        self.call_twice_same_block(lambda: fa.attn_bwd(q, k, v, o, dout, lse, dq=dq, dk=dk,
                                                       dv=dv, client=self.c), "backward")
        # the deterministic flag is part of what a plan is for
        fast, full = sent(self.c, lambda: fa.attn_bwd(q, k, v, o, dout, lse, dq=dq, dk=dk,
                                                      dv=dv, deterministic=True,
                                                      client=self.c))
        self.assertEqual(fast, full)

    def test_a_library_without_prepared_calls_serves_every_call_the_full_way(self):
        q = self.shm((1, 5, 2, 8))
        o = fa.empty_host((1, 5, 2, 8), "float32", client=self.c)
        real = self.c._lib

        class Older:  # a libfaclient from before fa_prepare
            def __getattr__(self, name):
                if name.startswith("fa_prepare"):
                    raise AttributeError(name)
                return getattr(real, name)
        self.c._tls = type(self.c._tls)()  # no plans yet on this thread
        self.c._lib = Older()
        try:
            hits = fa._fast.hits
            for _ in range(3):
                fa.flash_attn_func(q, q, q, out=o, client=self.c)
            self.assertEqual(fa._fast.hits, hits)
            self.assertLessEqual(rel_err(o, reference(q, q, q)[0]), TOL["float32"])
        finally:
            self.c._lib = real

    def test_the_last_plan_of_each_op_is_tried_first_and_the_others_are_found(self):
        a, b = self.shm((1, 4, 2, 8)), self.shm((1, 6, 2, 8))
        oa = fa.empty_host(a.shape, "float32", client=self.c)
        ob = fa.empty_host(b.shape, "float32", client=self.c)
        for _ in range(2):  # two plans, alternating: each call finds its own
            for x, o in ((a, oa), (b, ob), (a, oa)):
                fa.flash_attn_func(x, x, x, out=o, client=self.c)
                fast, full = sent(self.c, lambda: fa.flash_attn_func(x, x, x, out=o,
                                                                     client=self.c))
                self.assertEqual(fast, full)
                self.assertLessEqual(rel_err(o, reference(x, x, x)[0]), TOL["float32"])

    @unittest.skipIf(torch is None, NO_TORCH)
    def test_torch_cpu_tensors_in_shared_memory_repeat_through_a_plan(self):
        q = fa.empty_host((2, 4, 7, 16), torch.float32, client=self.c)  # [B, H, S, D]
        q.copy_(torch.randn(q.shape))
        o = fa.empty_host((2, 4, 7, 16), torch.float32, client=self.c)
        self.call_twice_same_block(lambda: fa.scaled_dot_product_attention(
            q, q, q, is_causal=True, out=o, client=self.c), "torch sdpa")
        t = torch.nn.functional.scaled_dot_product_attention(q.double(), q.double(),
                                                             q.double(), is_causal=True)
        self.assertLessEqual((o.double() - t).norm().item() / t.norm().item(), 1e-5)
        qt = q.transpose(1, 2)  # the same memory as BSHD strides: another block
        ot = o.transpose(1, 2)
        fast, full = sent(self.c, lambda: fa.flash_attn_func(qt, qt, qt, out=ot,
                                                             client=self.c))
        self.assertEqual(fast, full)


# ---- device arrays without a GPU ---------------------------------------------------------------
class FakeDeviceArray:
    """A float32 CUDA array for the package (its __cuda_array_interface__) over host memory."""

    def __init__(self, ptr, shape, strides=None):
        self.ptr, self.shape, self.strides = ptr, tuple(shape), strides
        self.__cuda_array_interface__ = {
            "data": (ptr, False), "shape": self.shape, "typestr": "<f4", "version": 3,
            "strides": None if strides is None else tuple(4 * s for s in strides)}

    def numpy(self):
        st = self.strides
        if st is None:
            st, acc = [], 1
            for s in reversed(self.shape):
                st.append(acc)
                acc *= s
            st = list(reversed(st))
        n = 1 + sum((a - 1) * b for a, b in zip(self.shape, st))
        mem = (C.c_float * n).from_address(self.ptr)
        return np.lib.stride_tricks.as_strided(np.frombuffer(mem, np.float32),
                                               self.shape, [4 * s for s in st])


def _fake_sig(x):
    return fa._arrays.CUDA, x.ptr, (9, x.shape, x.strides)


class FakeDriver:
    """Allocations in host memory with the driver's ids; free and reuse under test control."""

    def __init__(self):
        self.allocs = {}  # base -> [size, buffer id, exportable cause or None]
        self.next_id = 100
        self.mem = []
        self.copies = 0
        self.id_queries = 0
        self.syncs = 0

    def alloc(self, size, cause=None, at=None):
        if at is None:
            b = C.create_string_buffer(size + 512)
            self.mem.append(b)
            at = (C.addressof(b) + 255) & ~255
        self.next_id += 1
        self.allocs[at] = [size, self.next_id, cause]
        return at

    def free(self, base):
        del self.allocs[base]

    def _find(self, ptr):
        for base, (size, bid, cause) in self.allocs.items():
            if base <= ptr < base + size:
                return base, size, bid, cause
        return None

    def range_of(self, ptr):
        f = self._find(ptr)
        return (f[0], f[1], f[2], 0) if f else (0, 0, 0, -1)

    def buffer_id(self, ptr):
        self.id_queries += 1
        f = self._find(ptr)
        return f[2] if f else 0

    def not_exportable_cause(self, ptr):
        return self._find(ptr)[3]

    def context_of(self, ptr, ordinal):
        return 1

    def mem_alloc(self, ctx, size):
        return self.alloc(size)

    def mem_free(self, ctx, ptr):
        self.free(ptr)

    def copy_async(self, ctx, dst, src, n, stream):
        self.copies += 1
        C.memmove(dst, src, n)

    def stream_sync(self, ctx, stream):
        pass

    def synchronize(self, stream=None):
        self.syncs += 1


class FakeLib:
    """The library as a client of fake device memory sees it: registrations are handles to
    bases; fa_attn_fwd checks the block and writes 7.0 into every element of o."""

    def __init__(self, real, drv):
        self.real, self.drv = real, drv
        self.handles = {}   # registration handle -> base
        self.ids = {}       # handle -> the allocation's id at registration
        self.freed = []
        self.prepared = {}
        self.refused = []   # (index, status) of the places fa_prepared_call refused

    def __getattr__(self, name):
        return getattr(self.real, name)

    def fa_buffer_free(self, h):
        self.freed.append(h)
        return 0

    def fa_buffer_data(self, h):
        return self.handles[h]

    # client/fa_prepared.c's contract over the fake memory: the places checked (inside the
    # registered allocation, its buffer id still the one registered, once per buffer), the
    # block patched in a copy, the stream waited for, then the call.
    def fa_prepare(self, c, op, src, n, fields, spans, out):
        assert op == fa._abi.FA_PREPARED_FWD, "the fake serves the forward"
        self.next_prepared = h = getattr(self, "next_prepared", 1000) + 1
        self.prepared[h] = (C.string_at(src, FWD_BYTES), list(fields[:n]), list(spans[:n]))
        out._obj.value = h
        return 0

    def fa_prepared_free(self, h):
        del self.prepared[h]

    def fa_prepared_call(self, h, place):
        block, fields, spans = self.prepared[h]
        pl = fa._abi.fa_placement.from_address(place)
        pl.moved = -1
        blk = C.create_string_buffer(block, FWD_BYTES + fa._abi.ARGS_SLACK)
        seen = set()
        for i, (field, span) in enumerate(zip(fields, spans)):
            buf, addr = pl.buf[i], pl.addr[i]
            base = self.handles[buf]
            size = self.drv.allocs[base][0] if base in self.drv.allocs else 0
            st = None
            if not (base <= addr and addr + span <= base + size):
                st = fa._abi.FA_ERANGE
            elif buf not in seen:
                if self.drv.buffer_id(addr) != self.ids[buf]:
                    st = fa._abi.FA_EREGION
                seen.add(buf)
            if st is not None:
                pl.moved = i
                self.refused.append((i, st))
                return st
            struct.pack_into("<QQ", blk, field, buf, addr - base)
        if pl.flags & fa._abi.FA_PLACE_SYNC_STREAM:
            self.drv.synchronize(pl.stream)
        return self.fa_attn_fwd(None, C.addressof(blk))

    def fa_attn_fwd(self, c, addr):
        a = fa._abi.fa_attn_fwd_args.from_address(addr)
        for t in (a.q, a.k, a.v, a.o):
            base = self.handles[t.buf]
            size, bid, cause = self.drv.allocs[base]  # a freed registration: KeyError
            self.assertTrue(cause is None, "a non-exportable allocation reached the daemon")
            span = 4 * (1 + sum((t.shape[i] - 1) * t.stride[i] for i in range(4)))
            self.assertTrue(t.offset + span <= size, "a tensor past its allocation")
        o = a.o
        base = self.handles[o.buf]
        for b in range(o.shape[0]):
            for s in range(o.shape[1]):
                for h in range(o.shape[2]):
                    at = base + o.offset + 4 * (b * o.stride[0] + s * o.stride[1] +
                                                h * o.stride[2])
                    (C.c_float * o.shape[3]).from_address(at)[:] = [7.0] * o.shape[3]
        return 0

    @staticmethod
    def assertTrue(x, msg):
        if not x:
            raise AssertionError(msg)


@unittest.skipIf(np is None, NO_NUMPY)
class FastPathOnFakeDeviceMemory(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.d.close()

    def setUp(self):
        fa._fast.enabled = True
        self.drv = FakeDriver()
        self.saved = fa._cuda._cu
        fa._cuda._cu = self.drv
        fa._fast._SIG[FakeDeviceArray] = _fake_sig
        self.c = fa.Client(self.d.url)
        self.lib = FakeLib(self.c._lib, self.drv)
        self.c._lib = self.lib
        self.registered = []
        self.next_handle = 1

        def register(base, size):
            cause = self.drv.allocs[base][2]
            self.registered.append(base)
            if cause is not None:
                raise fa._errors.usage("FA_EIPC", "device pointer 0x%x is %s" % (base, cause))
            h = self.next_handle = self.next_handle + 1
            self.lib.handles[h] = base
            self.lib.ids[h] = self.drv.allocs[base][1]
            return h
        self.c._register_device = register
        fa._attn._warned.clear()

    def tearDown(self):
        fa._cuda._cu = self.saved
        del fa._fast._SIG[FakeDeviceArray]
        self.c._lib = self.lib.real
        self.c._dev, self.c._dev_stages = {}, []  # fake handles: nothing to free
        self.c.close()

    def arr(self, shape, base=None, cause=None, fill=None):
        n = 1
        for s in shape:
            n *= s
        if base is None:
            base = self.drv.alloc(4 * n, cause)
        x = FakeDeviceArray(base, shape)
        x.numpy()[...] = fill if fill is not None else np.arange(n).reshape(shape) % 5
        return x

    def fwd(self, q, o):
        return fa.flash_attn_func(q, q, q, out=o, client=self.c)

    def test_a_loop_registers_each_allocation_once_and_queries_one_id_per_allocation(self):
        q, o = self.arr((1, 4, 2, 8)), self.arr((1, 4, 2, 8))
        self.fwd(q, o)
        made, hits, ids = self.c.device_registrations_made, fa._fast.hits, self.drv.id_queries
        syncs = self.drv.syncs
        for _ in range(10):
            o.numpy()[...] = 0
            self.fwd(q, o)
            self.assertTrue((o.numpy() == 7.0).all())
        self.assertEqual(self.c.device_registrations_made, made)
        self.assertEqual(fa._fast.hits, hits + 10)
        self.assertEqual(self.drv.id_queries, ids + 20, "q (three times) and o: two ids")
        self.assertEqual(self.drv.syncs, syncs + 10, "a synchronous call waits for the "
                         "producer on the fast path too")
        fast, full = sent(self.c, lambda: self.fwd(q, o))
        self.assertEqual(fast, full)

    def test_an_allocation_freed_and_reused_at_the_same_address_is_registered_anew(self):
        q, o = self.arr((1, 4, 2, 8)), self.arr((1, 4, 2, 8))
        self.fwd(q, o)
        self.fwd(q, o)
        old = {r.base: r.buf for r in self.c._dev.values()}
        for size in (4 * 64, 4 * 64 * 4, 4 * 64):  # same size, larger, same size again
            self.drv.free(o.ptr)
            self.drv.alloc(size, at=o.ptr)  # a new id at the same address
            hits = fa._fast.hits
            o.numpy()[...] = 0
            fast, full = sent(self.c, lambda: self.fwd(q, o))
            self.assertEqual(fa._fast.hits, hits, "size %d: a plan took a reused address"
                             % size)
            self.assertEqual(fast, full)
            self.assertTrue((o.numpy() == 7.0).all())
            new = self.c._dev[o.ptr]
            self.assertNotEqual(new.buf, old[o.ptr], "the stale registration was used")
            self.assertEqual(new.size, size)
            self.assertIn(old[o.ptr], self.lib.freed, "the stale registration was not freed")
            old[o.ptr] = new.buf

    def test_an_address_a_plan_never_saw_is_resolved_the_full_way(self):
        base = self.drv.alloc(4 * 64 * 2)
        q, o = self.arr((1, 4, 2, 8), base), self.arr((1, 4, 2, 8))
        self.fwd(q, o)
        self.fwd(q, o)
        q2 = FakeDeviceArray(base + 4 * 64, (1, 4, 2, 8))  # the same allocation's other half
        hits = fa._fast.hits
        self.fwd(q2, o)
        self.assertEqual(fa._fast.hits, hits)
        self.fwd(q2, o)
        self.assertEqual(fa._fast.hits, hits + 1)
        fast, full = sent(self.c, lambda: self.fwd(q2, o))
        self.assertEqual(fast, full)

    def test_a_place_the_library_refuses_goes_the_full_way(self):
        base = self.drv.alloc(4 * 64 * 2)
        q, o = self.arr((1, 4, 2, 8), base), self.arr((1, 4, 2, 8))
        self.fwd(q, o)
        reg = self.c._dev[base]
        inside, past = base + 4 * 64, base + 4 * 64 + 4
        # a table entry claiming the registration for addresses where the tensor reaches
        # past it, or starts before it: the library refuses the place, the full path runs
        for at, refused in ((inside, False), (past, True), (base - 4, True)):
            self.c._dev_ptr[at] = reg
            x = FakeDeviceArray(at, (1, 4, 2, 8))
            hits, before = fa._fast.hits, len(self.lib.refused)
            meta = (False, 0, 0.0, 0, True, fa._attn.NO_WINDOW, 0.0)
            k = fa._fast.serve(self.c, fa._fast.FWD, meta, (x, x, x, o), None)
            self.assertEqual(k is None, not refused, hex(at))
            self.assertEqual(fa._fast.hits, hits + (not refused))
            self.assertEqual(len(self.lib.refused), before + refused)
            if refused:
                self.assertEqual(self.lib.refused[-1], (0, fa._abi.FA_ERANGE))
            del self.c._dev_ptr[at]

    def test_a_freed_allocation_is_refused_by_its_buffer_id_before_the_table_knows(self):
        q, o = self.arr((1, 4, 2, 8)), self.arr((1, 4, 2, 8))
        self.fwd(q, o)
        self.fwd(q, o)
        # freed and reused at the same address and size: the Python table still maps the
        # address to the old registration; the id check in the prepared call refuses it
        self.drv.free(o.ptr)
        self.drv.alloc(4 * 64, at=o.ptr)
        before = len(self.lib.refused)
        self.fwd(q, o)
        self.assertEqual(self.lib.refused[before:], [(3, fa._abi.FA_EREGION)])
        self.assertTrue((o.numpy() == 7.0).all())

    def test_a_cleared_cache_is_never_used_from_a_plan(self):
        q, o = self.arr((1, 4, 2, 8)), self.arr((1, 4, 2, 8))
        self.fwd(q, o)
        self.fwd(q, o)
        made = self.c.device_registrations_made
        self.c.clear_device_cache()
        self.fwd(q, o)
        self.assertEqual(self.c.device_registrations_made, made + 2)

    def test_non_exportable_memory_is_copied_and_said_once_per_cause(self):
        pool = fa._cuda.CAUSE_POOL
        managed = fa._cuda.CAUSE_MANAGED
        q = self.arr((1, 4, 2, 8), cause=pool)
        o = self.arr((1, 4, 2, 8), cause=pool, fill=0.0)
        with self.assertWarns(fa.FaCopyWarning) as w:
            self.fwd(q, o)
        self.assertIn(pool, str(w.warning))
        self.assertTrue((o.numpy() == 7.0).all(), "the staged output was not copied back")
        attempts = len(self.registered)
        import warnings
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            o.numpy()[...] = 0
            self.fwd(q, o)  # the same cause again: no second warning
            self.assertTrue((o.numpy() == 7.0).all())
            self.assertEqual([x for x in rec if issubclass(x.category, fa.FaCopyWarning)], [])
            self.assertEqual(len(self.registered), attempts, "a known non-exportable "
                             "allocation was tried again")
            qm = self.arr((1, 4, 2, 8), cause=managed)
            self.fwd(qm, o)  # another cause: said once too
            said = [str(x.message) for x in rec if issubclass(x.category, fa.FaCopyWarning)]
            self.assertEqual(len(said), 1, said)
            self.assertIn(managed, said[0])
        hits = fa._fast.hits
        self.fwd(q, o)
        self.assertEqual(fa._fast.hits, hits, "a staged call is never a plan's")

    def test_exportable_memory_beside_non_exportable_is_used_in_place(self):
        q = self.arr((1, 4, 2, 8), cause=fa._cuda.CAUSE_VMM)
        o = self.arr((1, 4, 2, 8), fill=0.0)  # exportable: written in place
        with self.assertWarns(fa.FaCopyWarning):
            self.fwd(q, o)
        self.assertTrue((o.numpy() == 7.0).all())
        a = self.c._dev[o.ptr]
        self.assertEqual(self.lib.handles[a.buf], o.ptr)

    def test_a_strided_non_exportable_output_keeps_the_bytes_between_its_elements(self):
        q = self.arr((1, 4, 2, 8), cause=fa._cuda.CAUSE_POOL)
        base = self.drv.alloc(4 * 4 * 3 * 8, fa._cuda.CAUSE_POOL)
        packed = FakeDeviceArray(base, (1, 4, 3, 8))
        packed.numpy()[...] = -1.0
        o = FakeDeviceArray(base + 4 * 8, (1, 4, 2, 8), (96, 24, 8, 1))  # heads 1 and 2
        with self.assertWarns(fa.FaCopyWarning):
            self.fwd(q, o)
        got = packed.numpy()
        self.assertTrue((got[:, :, 1:] == 7.0).all())
        self.assertTrue((got[:, :, 0] == -1.0).all(), "a hole of the output was overwritten")

    def test_closing_the_client_frees_the_staging_buffers(self):
        q = self.arr((1, 4, 2, 8), cause=fa._cuda.CAUSE_POOL)
        o = self.arr((1, 4, 2, 8), cause=fa._cuda.CAUSE_POOL)
        with self.assertWarns(fa.FaCopyWarning):
            self.fwd(q, o)
        stages = list(self.c._dev_stages)
        self.assertEqual(len(stages), 1)
        from fa import _devstage
        _devstage.release_all(self.c, self.drv)
        self.assertNotIn(stages[0].ptr, self.drv.allocs)
        self.assertEqual(self.c._dev_stages, [])


class _StubClient:
    def __init__(self, refuse_async=None, refuse_sync=None):
        self._async_refused = None
        self.calls = []
        self.refuse = {"async": refuse_async, "sync": refuse_sync}

    def _call(self, fn, *args, what=None):
        self.calls.append(fn)
        st = self.refuse[fn]
        if st:
            raise fa._errors.usage(st, "refused by the stub")


@unittest.skipIf(np is None, NO_NUMPY)
class AutoStreamDecision(unittest.TestCase):
    """stream "auto" (autograd's default): asynchronous while the daemon serves it."""

    def run_once(self, c, stream="auto"):
        synced = []
        fa._attn._ordered(c, 0, stream, "sync", "async", 0, lambda: synced.append(1))
        return synced

    def test_auto_calls_asynchronously_without_waiting_for_the_stream(self):
        c = _StubClient()
        self.assertEqual(self.run_once(c), [])
        self.assertEqual(c.calls, ["async"])

    def test_a_daemon_refusing_async_gets_synchronous_calls_from_then_on(self):
        for status in ("FA_EPERM", "FA_ENOTSUP"):
            c = _StubClient(refuse_async=status)
            self.assertEqual(self.run_once(c), [1], "the stream waited for first")
            self.assertEqual(c.calls, ["async", "sync"])
            self.assertEqual(c._async_refused.status, status)
            self.run_once(c)
            self.assertEqual(c.calls, ["async", "sync", "sync"], "async tried again")

    def test_a_refusal_the_synchronous_call_shares_is_the_calls_error(self):
        c = _StubClient(refuse_async="FA_ENOTSUP", refuse_sync="FA_ENOTSUP")
        with self.assertRaises(fa.FaNotSupportedError):
            self.run_once(c)
        self.assertIsNone(c._async_refused, "a shape both modes refuse disabled async")

    def test_other_errors_and_explicit_current_never_fall_back(self):
        c = _StubClient(refuse_async="FA_ESHAPE")
        with self.assertRaises(fa.FaArgumentError):
            self.run_once(c)
        c = _StubClient(refuse_async="FA_EPERM")
        with self.assertRaises(fa.FaError):
            self.run_once(c, "current")
        self.assertEqual(c.calls, ["async"])

    def test_small_calls_under_auto_are_synchronous(self):
        small, big = np.empty((1, 128, 16, 64)), np.empty((2, 4096, 16, 128))
        self.assertTrue(fa._attn.small_for_async(small, small, False))
        self.assertFalse(fa._attn.small_for_async(big, big, False))
        self.assertFalse(fa._attn.small_for_async(big.transpose(0, 2, 1, 3),
                                                  big.transpose(0, 2, 1, 3), True))
        self.assertFalse(fa._attn.small_for_async(np.empty(3), small, False))

    def test_stream_none_is_synchronous(self):
        c = _StubClient()
        self.assertEqual(self.run_once(c, None), [1])
        self.assertEqual(c.calls, ["sync"])


if __name__ == "__main__":
    unittest.main()
