"""FaError and its subclasses: a failed call as a Python exception.

Every error carries .status (the status name, "FA_ESHAPE"), .code (its number) and .detail (the
daemon's or the library's detail text, fa_last_error_detail(), read on the failing thread right
after the call). The subclasses also derive from the built-in exception a Python caller would
catch for that kind of failure, so `except ValueError` catches bad shapes.
"""
from . import _abi


class FaError(RuntimeError):
    """A call to fa failed. .status: name, .code: number, .detail: the daemon's detail text."""

    def __init__(self, status, detail="", text=None):
        self.status = status
        self.code = _abi.FA_STATUS.get(status, -1)
        self.detail = detail or ""
        self.text = text or status
        msg = "%s: %s" % (status, self.text)
        if self.detail:
            msg += " (%s)" % self.detail
        super().__init__(msg)

    def __reduce__(self):  # survives pickling (multiprocessing)
        return (_make, (self.status, self.detail, self.text))


class FaArgumentError(FaError, ValueError):
    """Bad arguments: shapes, dtypes, strides, alignment, extents, overlap."""


class FaNotSupportedError(FaError, NotImplementedError):
    """A valid request this package, library or daemon does not serve."""


class FaUnavailableError(FaError, ConnectionError):
    """No daemon, a closed connection, or a restarted daemon that could not be reconnected."""


class FaTimeoutError(FaError, TimeoutError):
    """No reply within the client's timeout (the output may still be written later)."""


class FaMemoryError(FaError, MemoryError):
    """Out of host memory, or a session limit (regions, sessions) reached."""


_CLASS = {}
for _n in ("FA_EINVAL", "FA_ESHAPE", "FA_EDTYPE", "FA_ERANGE", "FA_EALIGN", "FA_EOVERLAP",
           "FA_EREGION", "FA_ETOOBIG"):
    _CLASS[_n] = FaArgumentError
for _n in ("FA_ENOTSUP", "FA_ENOGPU", "FA_EIPC", "FA_ENOFIT"):
    _CLASS[_n] = FaNotSupportedError
for _n in ("FA_EUNAVAIL", "FA_ECLOSED", "FA_ESESSION", "FA_EVERSION", "FA_EPROTO"):
    _CLASS[_n] = FaUnavailableError
_CLASS["FA_ETIMEDOUT"] = FaTimeoutError
_CLASS["FA_ENOMEM"] = FaMemoryError
_CLASS["FA_ELIMIT"] = FaMemoryError


def _make(status, detail="", text=None):
    return _CLASS.get(status, FaError)(status, detail, text)


def error(lib, st, context=None):
    """The exception for status number `st` of the call that just failed on this thread."""
    detail = lib.fa_last_error_detail().decode(errors="replace")
    if context:
        detail = "%s: %s" % (context, detail) if detail else context
    return _make(lib.fa_status_name(st).decode(), detail, lib.fa_strerror(st).decode())


def usage(status, detail):
    """An error found in Python before any call (same classes, the status it would have had)."""
    return _make(status, detail, None)
