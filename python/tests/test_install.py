"""`pip install ./python` into a fresh venv works offline (the in-tree backend needs nothing
from a registry), `pip wheel` builds a pure wheel, and an installed `import fa` finds the
library through FA_LIBRARY, the loader's path and pkg-config, or says what it tried."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

import common
from fa_daemon import build_dir

PKG = os.path.dirname(common.HERE)
LIB = os.path.join(build_dir(), "libfaclient.so.0")


def _venv_reason():
    import importlib.util
    if not all(importlib.util.find_spec(m) for m in ("ensurepip", "venv")):  # python3-venv
        return "%s has no venv/ensurepip (Debian: python3-venv)" % sys.executable
    return None


@unittest.skipIf(_venv_reason(), _venv_reason())
class Install(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="fa-pip.")
        cls.venv = os.path.join(cls.tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", cls.venv], check=True)
        cls.py = os.path.join(cls.venv, "bin", "python")
        env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        r = subprocess.run([cls.py, "-m", "pip", "install", "-q", PKG], env=env,
                           capture_output=True, text=True, cwd=cls.tmp)
        cls.pip = r

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_py(self, code, **env):
        e = {k: v for k, v in os.environ.items()
             if k not in ("FA_LIBRARY", "LD_LIBRARY_PATH", "PKG_CONFIG_PATH", "PYTHONPATH")}
        e.update(env)
        return subprocess.run([self.py, "-c", code], capture_output=True, text=True,
                              env=e, cwd=self.tmp)

    def test_pip_install_works_without_an_index(self):
        self.assertEqual(self.pip.returncode, 0, self.pip.stdout + self.pip.stderr)
        r = self.run_py("import fa, os; print(fa.__file__)")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.strip().startswith(self.venv), r.stdout)

    def test_installed_fa_finds_the_library(self):
        self.assertEqual(self.pip.returncode, 0, self.pip.stderr)
        code = "import fa; print(fa.library_path()); print(fa.library_version())"
        r = self.run_py(code, FA_LIBRARY=LIB)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split()[0], LIB)
        r = self.run_py(code, LD_LIBRARY_PATH=build_dir())
        self.assertEqual(r.returncode, 0, r.stderr)
        if shutil.which("pkg-config"):
            pc = os.path.join(self.tmp, "pc")
            os.makedirs(pc, exist_ok=True)
            with open(os.path.join(pc, "libfaclient.pc"), "w") as f:
                f.write("libdir=%s\nName: libfaclient\nDescription: t\nVersion: 0.1.0\n"
                        "Libs: -L${libdir} -lfaclient\n" % build_dir())
            r = self.run_py(code, PKG_CONFIG_PATH=pc)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.split()[0], os.path.join(build_dir(), "libfaclient.so.0"))

    def test_without_a_library_the_error_says_what_was_tried(self):
        r = self.run_py("import fa; fa.library_path()", PKG_CONFIG_PATH="/nonexistent",
                        LD_LIBRARY_PATH="/nonexistent")
        if r.returncode == 0:
            self.skipTest("a libfaclient is installed system-wide here")
        self.assertIn("libfaclient not found", r.stderr)
        self.assertIn("FA_LIBRARY", r.stderr)

    def test_pip_wheel_builds_a_pure_wheel(self):
        out = os.path.join(self.tmp, "wheels")
        env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        r = subprocess.run([self.py, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, PKG],
                           env=env, capture_output=True, text=True, cwd=self.tmp)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        wheels = os.listdir(out)
        self.assertEqual(len(wheels), 1, wheels)
        self.assertTrue(wheels[0].endswith("-py3-none-any.whl"), wheels)
        names = zipfile.ZipFile(os.path.join(out, wheels[0])).namelist()
        for need in ("fa/__init__.py", "fa/_abi.py"):
            self.assertIn(need, names)
        self.assertFalse([n for n in names if n.endswith((".so", ".pyc"))], names)


if __name__ == "__main__":
    unittest.main()
