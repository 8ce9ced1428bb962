"""fa.Client: one connection and session with the daemon, the buffers it registered, and the
process-wide default client.

Buffers belong to the session that registered them, so each Client keeps its own:
- host buffers (fa.empty_host): an address table, so an array living in one is used in place;
- device registrations: one per CUDA allocation (not per tensor), keyed by the allocation's base
  and checked on every use against the driver's unique buffer id, so a training loop registers
  each allocation once and an allocation freed and reused at the same address is registered anew;
  at the daemon's region limit the least recently used ones are unregistered;
- staging buffers (per thread) for the inputs and outputs that are not in daemon-visible memory.

Threads: calls from several threads run at once (ctypes drops the GIL in the C call, and the C
library keeps one socket per call in flight). Reconnecting after a daemon restart waits for the
calls in flight to finish first (fa_client_reconnect must not race with them).

fork: nanomsg is not fork-safe. A child of a process with an open Client cannot use it, nor
open a new one (the library's threads did not survive the fork): such calls raise FaError
FA_ECLOSED naming the cause. Use multiprocessing's "spawn" or "forkserver" start methods.
"""
import bisect
import ctypes as C
import itertools
import os
import threading
import weakref

from . import _abi, _lib
from ._errors import error, usage

_state = threading.Lock()
_open_clients = 0       # live fa_client handles in this process
_forked_dirty = False   # a fork happened while some were open
_default = None
_clients = weakref.WeakSet()  # every open Client (fa.empty_cache clears them all)
# Clients by a small integer, for what can carry no Python object (a torch.library op's
# arguments); 0 stands for the default client.
_op_ids = itertools.count(1)
_by_op_id = weakref.WeakValueDictionary()


def _after_fork_in_child():
    global _forked_dirty, _default, _open_clients
    if _open_clients:
        _forked_dirty = True
    _default = None
    _open_clients = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _check_fork():
    if _forked_dirty:
        raise usage("FA_ECLOSED", "this process was forked while a fa.Client was open; "
                    "nanomsg does not survive fork: start workers with multiprocessing's "
                    "'spawn' or 'forkserver' method, or open clients only after forking")


class _HostBuffer:
    """One fa_buffer_alloc_host buffer; freed when the last array over it goes away."""
    __slots__ = ("client", "buf", "base", "size", "__weakref__")

    def __init__(self, client, size):
        self.client = client
        self.buf = client._alloc_host(size)
        self.base = client._lib.fa_buffer_data(self.buf)
        self.size = size
        client._host_add(self)

    def __del__(self):
        c, self.client = getattr(self, "client", None), None
        if c is not None and self.buf:
            c._host_remove(self)
            c._free(self.buf)
            self.buf = None
            if c._closing:
                c._close_if_unused()


class _ArrayOwner:
    """The base object of an array made by empty_host: exports the memory (array interface) and
    keeps its _HostBuffer alive as long as any view of it lives."""

    def __init__(self, hb, ptr, shape, typestr, descr):
        self.hb = hb
        self.__array_interface__ = {"data": (ptr, False), "shape": tuple(shape),
                                    "typestr": typestr, "descr": descr, "version": 3}


class _DeviceReg:
    __slots__ = ("buf", "base", "size", "bufid", "used", "ordinal")

    def __init__(self, buf, base, size, bufid, ordinal=-1):
        self.buf, self.base, self.size, self.bufid, self.used = buf, base, size, bufid, 0
        self.ordinal = ordinal


class Client:
    """A connection and session with fa-daemon.

    addr: "ipc:///path" or a socket path; None: $FA_SOCKET, else the per-user or system default.
    timeout_ms: per-call timeout (None: the library's default, 30 s or $FA_TIMEOUT_MS; 0 waits
    forever). Use as a context manager, or close(); the process-wide default client
    (fa.default_client()) lives until exit.
    """

    def __init__(self, addr=None, timeout_ms=None):
        _check_fork()
        self._lib = lib = _lib.load()
        self._c = _abi.fa_client_p()
        self._closing = False
        self.addr = addr
        st = lib.fa_client_open(C.byref(self._c), addr.encode() if addr else None)
        if st:
            self._c = None
            raise error(lib, st, "fa_client_open(%s)" % (addr or "default socket"))
        global _open_clients
        with _state:
            _open_clients += 1
        self._pid = os.getpid()
        # The session's epoch as the library holds it; it changes only in fa_client_reconnect,
        # which only _reconnect_after calls (so a call reads this, not the library).
        self._epoch = lib.fa_client_epoch(self._c)
        if timeout_ms is not None:
            self.set_timeout(timeout_ms)
        self._cv_lock = threading.Lock()  # taken directly on the hot path (no Condition call)
        self._cv = threading.Condition(self._cv_lock)
        self._active = 0
        self._reconnecting = False
        self._host_lock = threading.Lock()
        self._host_starts = []   # sorted base addresses
        self._host_bufs = []     # weakrefs to _HostBuffer, same order
        self._dev_lock = threading.Lock()
        self._dev = {}           # allocation base -> _DeviceReg
        self._dev_ptr = {}       # device address last resolved -> its _DeviceReg (_fast.py);
                                 # emptied whenever a registration goes, so an entry is live
        self._dev_bad = {}       # allocation base -> (buffer id, cause): not exportable
        self._dev_clock = 0
        self._dev_stages = []    # device staging buffers (_devstage.py), every thread's
        self._async_refused = None  # the FaError with which the daemon refused async mode
        self._tls = threading.local()
        _clients.add(self)
        self._op_id = next(_op_ids)
        _by_op_id[self._op_id] = self

    # ---- lifetime -----------------------------------------------------------------------
    def close(self):
        """No more calls on this client: unregister its device allocations and staging, and
        close the session, once the arrays made by empty_host are gone too (their memory is
        the session's mapping, so it stays mapped until then). Idempotent."""
        if not getattr(self, "_c", None) or self._closing:
            return
        if os.getpid() != self._pid:  # an inherited handle: never touch nanomsg state here
            self._c = None
            return
        self._closing = True
        if self._dev_stages:
            from . import _cuda, _devstage
            _devstage.release_all(self, _cuda.driver())
        with self._dev_lock:
            regs, self._dev = list(self._dev.values()), {}
            self._dev_ptr = {}
        for r in regs:
            self._lib.fa_buffer_free(r.buf)
        self._tls = threading.local()  # this thread's staging goes now, others' with them
        self._close_if_unused()

    def _close_if_unused(self):
        with self._host_lock:
            if not self._closing or not self._c or any(r() for r in self._host_bufs):
                return
            c, self._c = self._c, None
        self._lib.fa_client_close(c)
        global _open_clients
        with _state:
            _open_clients = max(0, _open_clients - 1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _handle(self):
        _check_fork()
        if not self._c or self._closing:
            raise usage("FA_ECLOSED", "the fa.Client is closed")
        return self._c

    # ---- calls with reconnect -----------------------------------------------------------
    def _enter(self):
        with self._cv:
            while self._reconnecting:
                self._cv.wait()
            self._active += 1

    def _leave(self):
        with self._cv_lock:  # (the Condition's own lock, taken without its Python wrapper)
            self._active -= 1
            if self._reconnecting and self._active == 0:
                self._cv.notify_all()

    def _reconnect_after(self, epoch):
        """Reconnect once for every caller that saw FA_ESESSION under daemon epoch `epoch`."""
        with self._cv:
            self._active -= 1
            if self._reconnecting:
                while self._reconnecting:
                    self._cv.wait()
                self._active += 1
                return 0
            self._reconnecting = True
            while self._active:
                self._cv.wait()
        st = 0
        try:
            if self._lib.fa_client_epoch(self._c) == epoch:
                st = self._lib.fa_client_reconnect(self._c)
        finally:
            with self._cv:
                self._epoch = self._lib.fa_client_epoch(self._c)
                self._reconnecting = False
                self._active += 1
                self._cv.notify_all()
        return st

    def _call(self, fn, *args, what=None):
        """fn(client, *args) with FA_ESESSION handled: reconnect (re-registering every buffer)
        and retry once. Raises FaError."""
        c = self._c
        if not c or self._closing or _forked_dirty:
            c = self._handle()
        lk = self._cv_lock
        lk.acquire()
        try:
            while self._reconnecting:
                self._cv.wait()
            self._active += 1
        finally:
            lk.release()
        try:
            epoch = self._epoch
            st = fn(c, *args)
            if st == _abi.FA_ESESSION:
                rst = self._reconnect_after(epoch)
                if rst:
                    raise error(self._lib, rst, "fa_client_reconnect after a daemon restart")
                st = fn(c, *args)
            if st:
                raise error(self._lib, st, what)
        finally:
            self._leave()

    def _call_prepared(self, p):
        """The library's fa_prepared_call for plan p (_fast.py), its placement written: None
        when it succeeded, -1 when it refused a place (nothing was sent: the caller takes the
        full path), else the failure's status. FA_ESESSION is handled as in _call."""
        if not self._c or self._closing or _forked_dirty:
            self._handle()
        lk = self._cv_lock
        lk.acquire()
        try:
            while self._reconnecting:
                self._cv.wait()
            self._active += 1
        finally:
            lk.release()
        try:
            epoch = self._epoch
            fn = self._lib.fa_prepared_call
            st = fn(p.pp, p.place_addr)
            if st == 0:
                return None
            if st == _abi.FA_ESESSION and p.moved() < 0:
                rst = self._reconnect_after(epoch)
                if rst:
                    raise error(self._lib, rst, "fa_client_reconnect after a daemon restart")
                st = fn(p.pp, p.place_addr)
                if st == 0:
                    return None
            return -1 if p.moved() >= 0 else st
        finally:
            lk.acquire()
            self._active -= 1
            if self._reconnecting and self._active == 0:
                self._cv.notify_all()
            lk.release()

    # ---- small calls ----------------------------------------------------------------------
    def set_timeout(self, timeout_ms):
        st = self._lib.fa_client_set_timeout(self._handle(), int(timeout_ms))
        if st:
            raise error(self._lib, st, "fa_client_set_timeout")

    @property
    def epoch(self):
        """The daemon's epoch (changes when it restarted)."""
        return self._lib.fa_client_epoch(self._handle())

    def ping(self):
        self._call(self._lib.fa_ping, what="fa_ping")

    def reconnect(self):
        """Open a new session after a daemon restart, registering every buffer again (calls
        do this by themselves on FA_ESESSION)."""
        self._handle()
        self._enter()
        st = self._reconnect_after(self._lib.fa_client_epoch(self._c))
        self._leave()
        if st:
            raise error(self._lib, st, "fa_client_reconnect")

    def stats(self):
        """The daemon's STATS as {section: {key: value}} (numbers as int where they parse)."""
        buf = C.create_string_buffer(1 << 16)
        self._call(self._lib.fa_stats, buf, len(buf), what="fa_stats")
        sec = {}
        out = {"": sec}
        for line in buf.value.decode(errors="replace").splitlines():
            if line.startswith("#"):
                sec = out.setdefault(line[1:].strip(), {})
            elif ":" in line:
                k, v = line.split(":", 1)
                try:
                    v = int(v)
                except ValueError:
                    v = v.strip()
                sec[k.strip()] = v
        if not out[""]:
            del out[""]
        return out

    # ---- host buffers -----------------------------------------------------------------------
    def _alloc_host(self, size):
        b = _abi.fa_buffer_p()
        self._call(self._lib.fa_buffer_alloc_host, size, C.byref(b),
                   what="fa_buffer_alloc_host(%d bytes)" % size)
        return b.value

    def _free(self, buf):
        if self._c and os.getpid() == self._pid:
            self._lib.fa_buffer_free(buf)

    def _host_add(self, hb):
        with self._host_lock:
            i = bisect.bisect(self._host_starts, hb.base)
            self._host_starts = self._host_starts[:i] + [hb.base] + self._host_starts[i:]
            self._host_bufs = self._host_bufs[:i] + [weakref.ref(hb)] + self._host_bufs[i:]

    def _host_remove(self, hb):
        with self._host_lock:
            i = bisect.bisect_left(self._host_starts, hb.base)
            if i < len(self._host_starts) and self._host_starts[i] == hb.base:
                del self._host_starts[i]
                del self._host_bufs[i]

    def _host_find(self, lo, hi):
        """(fa_buffer, byte offset of lo) when [lo, hi) lies in one of this client's host
        buffers, else None."""
        starts, bufs = self._host_starts, self._host_bufs  # replaced, never mutated, under lock
        i = bisect.bisect(starts, lo) - 1
        if i < 0:
            return None
        hb = bufs[i]()
        if hb is None or hi > hb.base + hb.size or not hb.buf:
            return None
        return hb.buf, lo - hb.base

    def host_buffer(self, size):
        """A new host buffer of `size` bytes (see empty_host)."""
        return _HostBuffer(self, size)

    # ---- device registrations ---------------------------------------------------------------
    def _device_find(self, ptr, drv):
        """(fa_buffer, byte offset of ptr) for device memory at ptr: the registration of its
        allocation, made now if there is none or the allocation changed. Raises FaError."""
        r = self._device_reg(ptr, drv)
        return r.buf, ptr - r.base

    def _device_reg(self, ptr, drv):
        """The _DeviceReg of the allocation holding device address ptr (see _device_find).
        Memory CUDA IPC cannot export raises FaError FA_EIPC, remembered per allocation so a
        loop does not try again on every call (_devstage.py copies such arrays)."""
        base, size, bufid, ordinal = drv.range_of(ptr)
        if not base:
            raise usage("FA_EINVAL", "0x%x is not CUDA device memory the driver knows" % ptr)
        with self._dev_lock:
            self._dev_clock += 1
            r = self._dev.get(base)
            if r is not None and r.size == size and r.bufid == bufid:
                r.used = self._dev_clock
                self._remember_ptr(ptr, r)
                return r
            stale = self._dev.pop(base, None)
            if stale is not None:
                self._dev_ptr = {}
            bad = self._dev_bad.get(base)
        if bad is not None and bad[0] == bufid:
            raise usage("FA_EIPC", bad[1])
        if stale is not None:  # freed and reused at the same address: the old one is gone
            self._lib.fa_buffer_free(stale.buf)
        try:
            buf = self._register_device(base, size)
        except Exception as e:
            if getattr(e, "status", None) == "FA_EIPC":
                with self._dev_lock:
                    if len(self._dev_bad) >= 1024:
                        self._dev_bad.clear()
                    self._dev_bad[base] = (bufid, e.detail)
            raise
        with self._dev_lock:
            self._dev_clock += 1
            r = _DeviceReg(buf, base, size, bufid, ordinal)
            r.used = self._dev_clock
            old = self._dev.get(base)
            if old is not None:
                self._dev_ptr = {}
            self._dev[base] = r
            self._remember_ptr(ptr, r)
        if old is not None:  # another thread registered it meanwhile
            self._lib.fa_buffer_free(old.buf)
        self.device_registrations_made += 1
        return r

    def _remember_ptr(self, ptr, r):
        """Under _dev_lock: ptr was found in r (what _fast.serve looks up first)."""
        if len(self._dev_ptr) >= 8192:
            self._dev_ptr = {}
        self._dev_ptr[ptr] = r

    device_registrations_made = 0  # counter for tests: registrations this client made

    def _register_device(self, base, size):
        b = _abi.fa_buffer_p()
        for _ in range(2):
            try:
                self._call(self._lib.fa_buffer_register_device, base, size, C.byref(b),
                           what="fa_buffer_register_device(0x%x, %d bytes)" % (base, size))
                return b.value
            except Exception as e:
                if getattr(e, "status", None) != "FA_ELIMIT" or not self._evict_half():
                    raise
        raise AssertionError("unreachable")

    def _evict_half(self):
        """Unregister the least recently used half of the device registrations (the daemon's
        region limit was reached). False when there was nothing to evict."""
        with self._dev_lock:
            regs = sorted(self._dev.values(), key=lambda r: r.used)
            victims = regs[:max(1, len(regs) // 2)] if regs else []
            for r in victims:
                del self._dev[r.base]
            self._dev_ptr = {}
        for r in victims:
            self._lib.fa_buffer_free(r.buf)
        return bool(victims)

    def clear_device_cache(self):
        """Unregister every cached device allocation. Call it BEFORE memory it may hold is
        returned to the driver outside PyTorch's normal reuse (torch.cuda.empty_cache(), a
        CuPy pool's free_all_blocks()): CUDA requires an IPC-exported allocation to be
        unregistered before it is freed. fa.empty_cache() does both for PyTorch."""
        with self._dev_lock:
            regs, self._dev = list(self._dev.values()), {}
            self._dev_ptr = {}
        for r in regs:
            self._lib.fa_buffer_free(r.buf)

    @property
    def device_cache_size(self):
        """How many device allocations are registered now."""
        return len(self._dev)

    # ---- staging ------------------------------------------------------------------------------
    def _staging(self, size):
        """This thread's staging host buffer, at least `size` bytes."""
        hb = getattr(self._tls, "stage", None)
        if hb is None or hb.size < size:
            self._tls.stage = None
            cap = 1 << 20
            while cap < size:
                cap <<= 1
            hb = self._tls.stage = _HostBuffer(self, cap)
        return hb


def default_client():
    """The process-wide client (opened on first use on $FA_SOCKET or the default socket)."""
    global _default
    c = _default
    if c is not None and c._c and not c._closing:
        return c
    with _state:
        c = _default
    if c is None or not c._c or c._closing:
        c = Client()
        with _state:
            if _default is None or not _default._c or _default._closing:
                _default = c
            else:
                c.close()
                c = _default
    return c


def set_default_client(client):
    """Make `client` the process-wide default (None: open a new one on next use)."""
    global _default
    with _state:
        _default = client
