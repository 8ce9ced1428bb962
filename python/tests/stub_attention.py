"""A client whose attention calls do nothing: what the figures of the Python side alone use
(python/bench/call_overhead.py, gpu_torch_check.py). Every other library call (registrations,
buffers, STATS) goes to the real library.

    with Stubbed(client):
        ...   # fa calls on client run every Python step, and return at the library's door

The library's attention entry points (fa_attn_*, and fa_prepared_call, the fast path's: its
place checks, stream wait and call are the library's side) become Python functions returning
FA_OK, so the figure is the package's Python code up to the foreign call, without the foreign
call's own cost (ctypes' argument conversion, a few hundred ns: call_overhead.py measures it
apart)."""


def _ok(*args):
    return 0


class _StubLib:
    """The real library's functions as attributes (looked up as cheaply as on the CDLL), the
    attention ones replaced."""

    def __init__(self, real):
        from fa import _abi
        for name in _abi.PROTOTYPES:
            fn = getattr(real, name, None)
            if fn is not None:
                setattr(self, name, _ok if name.startswith("fa_attn_") or
                        name == "fa_prepared_call" else fn)
        self.real = real


class Stubbed:
    def __init__(self, client):
        self.c = client

    def __enter__(self):
        self.saved = self.c._lib
        self.c._lib = _StubLib(self.saved)
        return self

    def __exit__(self, *exc):
        self.c._lib = self.saved
