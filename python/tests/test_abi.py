"""The ctypes mirror (fa/_abi.py) against the C headers: a C program generated from the mirror
prints sizeof and offsetof of every mirrored struct and field, the value of every enum constant
and every status of FA_STATUS_MAP; any difference fails. Also: the package's version is the
library's, and the CUDA pointer attributes fa/_cuda.py uses match cuda.h when it is installed."""
import ctypes
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import common
from fa import _abi, _cuda, _version

REPO = os.path.dirname(os.path.dirname(common.HERE))
CC = os.environ.get("CC", "cc")
CUDA_H = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include", "cuda.h")


def c_program():
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "fa/fa_client.h"',
             "#define PRINT_STATUS(name, num, text) printf(\"status %s %d\\n\", #name, num);",
             "int main(void)", "{"]
    for cname, cls in _abi.STRUCTS:
        lines.append('\tprintf("sizeof %s %%zu\\n", sizeof(%s));' % (cname, cname))
        for fname, _ in cls._fields_:
            lines.append('\tprintf("offsetof %s.%s %%zu\\n", offsetof(%s, %s));'
                         % (cname, fname, cname, fname))
    for name in sorted(_abi.ENUMS):
        lines.append('\tprintf("enum %s %%d\\n", (int)%s);' % (name, name))
    lines += ["\tFA_STATUS_MAP(PRINT_STATUS)",
              '\tprintf("version %d.%d.%d\\n", FA_VERSION_MAJOR, FA_VERSION_MINOR, '
              "FA_VERSION_PATCH);", "\treturn 0;", "}"]
    return "\n".join(lines) + "\n"


def python_side():
    out = []
    for cname, cls in _abi.STRUCTS:
        out.append("sizeof %s %d" % (cname, ctypes.sizeof(cls)))
        for fname, _ in cls._fields_:
            out.append("offsetof %s.%s %d" % (cname, fname, getattr(cls, fname).offset))
    for name in sorted(_abi.ENUMS):
        out.append("enum %s %d" % (name, _abi.ENUMS[name]))
    return out


@unittest.skipUnless(shutil.which(CC), "no C compiler (%s) to build the layout program" % CC)
class Layout(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        d = tempfile.mkdtemp(prefix="fa-abi.")
        try:
            src = os.path.join(d, "layout.c")
            with open(src, "w") as f:
                f.write(c_program())
            exe = os.path.join(d, "layout")
            subprocess.run([CC, "-std=c11", "-Wall", "-Werror", "-I",
                            os.path.join(REPO, "client", "include"), "-I",
                            os.path.join(REPO, "common"), "-o", exe, src], check=True)
            cls.c_lines = subprocess.run([exe], check=True, capture_output=True,
                                         text=True).stdout.splitlines()
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_structs_and_enums_match_the_headers(self):
        want = [x for x in self.c_lines if x.split()[0] in ("sizeof", "offsetof", "enum")]
        self.assertEqual(python_side(), want)

    def test_every_status_of_the_header_is_mirrored(self):
        st = {}
        for line in self.c_lines:
            if line.startswith("status "):
                _, name, num = line.split()
                st[name] = int(num)
        self.assertEqual(_abi.FA_STATUS, st)

    def test_package_version_is_the_library_version(self):
        v = [x.split()[1] for x in self.c_lines if x.startswith("version ")][0]
        self.assertEqual(_version.__version__, v)
        self.assertEqual(_version.ABI_MAJOR, int(v.split(".")[0]))
        with open(os.path.join(REPO, "python", "pyproject.toml")) as f:
            self.assertIn('version = "%s"' % v, f.read())

    def test_the_packer_writes_what_ctypes_reads(self):
        import fa._attn as A
        block = ctypes.create_string_buffer(ctypes.sizeof(_abi.fa_attn_fwd_args))
        A._TENSOR.pack_into(block, A._OFF["k"], 0x1234, 64, _abi.FA_DTYPE_BF16, 1, 2, 3, 8,
                            48, 24, 8, 1)
        a = _abi.fa_attn_fwd_args.from_buffer(block)
        self.assertEqual((a.k.buf, a.k.offset, a.k.dtype), (0x1234, 64, _abi.FA_DTYPE_BF16))
        self.assertEqual((list(a.k.shape), list(a.k.stride)), ([1, 2, 3, 8], [48, 24, 8, 1]))
        self.assertEqual(a.q.buf, None)

    def test_the_backward_packer_writes_what_ctypes_reads(self):
        import fa._attn as A
        import fa._bwd as W
        block = ctypes.create_string_buffer(ctypes.sizeof(_abi.fa_attn_bwd_args))
        A._TENSOR.pack_into(block, W._OFF["dv"], 0x5678, 128, _abi.FA_DTYPE_FP16, 2, 3, 4, 16,
                            192, 64, 16, 1)
        A._DOUBLE.pack_into(block, W._SCALE, 0.25)
        A._INT.pack_into(block, W._MASK, _abi.FA_MASK_CAUSAL_TOP_LEFT)
        A._INT.pack_into(block, W._PREC, _abi.FA_PREC_TF32)
        A._INT.pack_into(block, W._FLAGS, _abi.FA_BWD_DETERMINISTIC)
        a = _abi.fa_attn_bwd_args.from_buffer(block)
        self.assertEqual((a.dv.buf, a.dv.offset, a.dv.dtype), (0x5678, 128, _abi.FA_DTYPE_FP16))
        self.assertEqual((list(a.dv.shape), list(a.dv.stride)), ([2, 3, 4, 16], [192, 64, 16, 1]))
        self.assertEqual((a.scale, a.mask, a.precision, a.flags),
                         (0.25, _abi.FA_MASK_CAUSAL_TOP_LEFT, _abi.FA_PREC_TF32,
                          _abi.FA_BWD_DETERMINISTIC))
        self.assertEqual((a.dq.buf, a.lse.buf), (None, None))
        self.assertIn("fa_attn_bwd_args", [n for n, _ in _abi.STRUCTS])
        self.assertIn("FA_BWD_DETERMINISTIC", _abi.ENUMS)


@unittest.skipUnless(os.path.exists(CUDA_H), "no %s to check the pointer attributes" % CUDA_H)
class CudaAttributes(unittest.TestCase):
    def test_pointer_attribute_values_match_cuda_h(self):
        with open(CUDA_H) as f:
            text = f.read()
        for name, value in _cuda.ATTRIBUTES.items():
            m = re.search(r"\b%s\s*=\s*(\d+)" % name, text)
            self.assertIsNotNone(m, name)
            self.assertEqual(int(m.group(1)), value, name)


if __name__ == "__main__":
    unittest.main()
