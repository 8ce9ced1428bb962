"""Finding and loading libfaclient.

Order: $FA_LIBRARY (a path), the in-tree build when the package is imported from its source tree
(<repo>/python/fa -> <repo>/$FA_BUILD or <repo>/build), the loader's own search
(libfaclient.so.<major>: LD_LIBRARY_PATH, the ld.so cache), pkg-config's libdir (a non-system
prefix), then ctypes.util.find_library. The first that loads wins; the error lists every try.
"""
import ctypes
import ctypes.util
import os
import subprocess
import threading

from . import _abi
from ._version import ABI_MAJOR

_SONAME = "libfaclient.so.%d" % ABI_MAJOR
_lock = threading.Lock()
_lib = None
_path = None


def _candidates():
    env = os.environ.get("FA_LIBRARY")
    if env:
        yield "FA_LIBRARY", env
        return  # an explicit choice is never second-guessed
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    if os.path.isfile(os.path.join(repo, "client", "include", "fa", "fa_client.h")):
        build = os.environ.get("FA_BUILD", "build")
        yield "in-tree build", os.path.join(repo, build, _SONAME)
    yield "loader search", _SONAME
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "libfaclient"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        libdir = ""
    if libdir:
        yield "pkg-config libdir", os.path.join(libdir, _SONAME)
    found = ctypes.util.find_library("faclient")
    if found:
        yield "ctypes.util.find_library", found


def load():
    """The loaded library (ctypes.CDLL, prototypes bound). Raises OSError naming every try."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for how, path in _candidates():
            if os.sep in path and not os.path.exists(path):
                tried.append("%s: %s (no such file)" % (how, path))
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                tried.append("%s: %s (%s)" % (how, path, e))
                continue
            missing = [n for n in _abi.bind(lib) if n in _abi.REQUIRED]
            if missing:
                tried.append("%s: %s (lacks %s)" % (how, path, ", ".join(missing)))
                continue
            version = lib.fa_version_string().decode()
            if int(version.split(".")[0]) != ABI_MAJOR:
                tried.append("%s: %s (version %s, this package needs %d.x)"
                             % (how, path, version, ABI_MAJOR))
                continue
            _lib, _path = lib, path
            return lib
        raise OSError("fa: libfaclient not found; tried:\n  " + "\n  ".join(tried) +
                      "\nInstall fa (make install), or set FA_LIBRARY to the library's path.")


def path():
    """Where the loaded library came from (loads it first)."""
    load()
    return _path
