"""The package's version: the C library's (common/fa_types.h), checked by tests/test_abi.py."""
__version__ = "0.1.0"
ABI_MAJOR = 0  # FA_VERSION_MAJOR: the libfaclient.so.<major> this package speaks to
