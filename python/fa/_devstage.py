"""The copy for device memory that CUDA IPC cannot export: managed memory, stream-ordered pools
(cudaMallocAsync, torch.cuda.MemPool), VMM allocations (PyTorch's expandable_segments).

The daemon sees a caller's device memory only through cuIpcGetMemHandle, which refuses these
(the library says FA_EIPC before anything is sent). Rather than fail, such an array is copied
into a staging buffer of plain cuMemAlloc memory (exportable; one per client, thread and device,
grown as needed, registered once like any allocation), the call computes there, and outputs are
copied back. The copy of an array is the bytes its elements span, holes included, so any
strides (negative too) keep their layout and the holes of an output are written back as they
were. A FaCopyWarning names the cause once per process and cause.

Ordering: the copies run on the producer's stream (PyTorch's current stream, the array's own
stream, else the default stream), which is then synchronised, so the daemon reads finished
inputs; the copies back run on the same stream and are synchronised before the call returns (a
staged call is synchronous in every mode: the staging buffer is reused by the next call).
"""
import threading

from ._errors import usage

ALIGN = 256
_lock = threading.Lock()
_contexts = {}  # device ordinal -> the context staging allocates and copies in


class _Buffer:
    __slots__ = ("ctx", "ptr", "size", "ordinal")

    def __init__(self, ctx, ptr, size, ordinal):
        self.ctx, self.ptr, self.size, self.ordinal = ctx, ptr, size, ordinal


class Staged:
    """What a staged call copies back afterwards (resolve's `back`): finish() after the call."""
    __slots__ = ("drv", "ctx", "stream", "copies")

    def __init__(self, drv, ctx, stream):
        self.drv, self.ctx, self.stream, self.copies = drv, ctx, stream, []

    def __bool__(self):
        return True

    def finish(self):
        """Outputs back to the caller's memory; returns when they are there. Raises FaError."""
        try:
            for dst, src, n in self.copies:
                self.drv.copy_async(self.ctx, dst, src, n, self.stream)
            self.drv.stream_sync(self.ctx, self.stream)
        except OSError as e:
            raise usage("FA_EDEVICE", "copying staged outputs back: %s" % e) from None


def _buffer(c, drv, ordinal, ctx, need):
    """This thread's staging buffer of client c on device `ordinal`, at least `need` bytes."""
    stages = getattr(c._tls, "dev_stages", None)
    if stages is None:
        stages = c._tls.dev_stages = {}
    b = stages.get(ordinal)
    if b is not None and b.size >= need:
        return b
    if b is not None:
        del stages[ordinal]
        release(c, drv, b)
    size = 1 << 20
    while size < need:
        size <<= 1
    try:
        ptr = drv.mem_alloc(ctx, size)
    except OSError as e:
        raise usage("FA_ENOMEM", "a %d-byte device staging buffer for memory CUDA IPC cannot "
                    "export: %s" % (size, e)) from None
    b = stages[ordinal] = _Buffer(ctx, ptr, size, ordinal)
    with _lock:
        c._dev_stages.append(b)
    return b


def release(c, drv, b):
    """Unregister staging buffer b (CUDA wants an exported allocation unregistered before it is
    freed), then free it."""
    with c._dev_lock:
        r = c._dev.pop(b.ptr, None)
    if r is not None:
        c._lib.fa_buffer_free(r.buf)
    drv.mem_free(b.ctx, b.ptr)
    with _lock:
        if b in c._dev_stages:
            c._dev_stages.remove(b)


def release_all(c, drv):
    """Every staging buffer of client c (its close)."""
    with _lock:
        bufs = list(c._dev_stages)
    for b in bufs:
        release(c, drv, b)


def stage(c, drv, views, tnames, outputs, res, bad, stream, warn_once):
    """Copy views[i] for i in bad into this thread's staging buffer and fill res[i] with the
    registration and offset there; returns the Staged to finish after the call."""
    spans = []
    total = 0
    for i in bad:
        v = views[i]
        lo, hi = v.extent()
        spans.append((i, lo, hi, total))
        total += (hi - lo + ALIGN - 1) // ALIGN * ALIGN
        cause = drv.not_exportable_cause(v.ptr)
        warn_once(("device", cause),
                  "fa: %s is %s, which CUDA IPC cannot export, so it is copied through an "
                  "exportable staging buffer on every call (outputs copied back); allocate "
                  "with plain cudaMalloc memory (PyTorch's default allocator) to avoid the "
                  "copies" % (tnames[i], cause))
    ordinal = drv.range_of(views[bad[0]].ptr)[3]
    ctx = _contexts.get(ordinal)
    if ctx is None:  # (a primary context is retained once per device, not per call)
        try:
            ctx = _contexts[ordinal] = drv.context_of(views[bad[0]].ptr, ordinal)
        except OSError as e:
            raise usage("FA_EDEVICE", "staging %s: %s" % (tnames[bad[0]], e)) from None
    b = _buffer(c, drv, ordinal, ctx, max(total, 1))
    st = Staged(drv, ctx, stream)
    try:
        for i, lo, hi, off in spans:
            v = views[i]
            dense = v.itemsize
            for n in v.shape:
                dense *= n
            if tnames[i] in outputs:
                st.copies.append((lo, b.ptr + off, hi - lo))
                if hi - lo == dense:  # no holes: nothing of the old bytes to keep
                    continue
            if hi > lo:
                drv.copy_async(ctx, b.ptr + off, lo, hi - lo, stream)
        drv.stream_sync(ctx, stream)
    except OSError as e:
        raise usage("FA_EDEVICE", "copying into the device staging buffer: %s" % e) from None
    for i, lo, hi, off in spans:
        res[i] = c._device_find(b.ptr + off + (views[i].ptr - lo), drv)
    return st
