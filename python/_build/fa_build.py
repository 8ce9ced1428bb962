"""A PEP 517 build backend for the fa package, in the tree and with no requirements, so
`pip install ./python` and `pip wheel ./python` work offline (a host with no package registry,
such as the GPU host): the package is pure Python, so a wheel is a zip of fa/ plus metadata.

Hooks: build_wheel, build_sdist, build_editable (PEP 660: a .pth pointing at this folder) and
the metadata ones. The metadata comes from pyproject.toml's [project] table.
"""
import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAG = "py3-none-any"


def _project():
    path = os.path.join(ROOT, "pyproject.toml")
    try:
        import tomllib
        with open(path, "rb") as f:
            return tomllib.load(f)["project"]
    except ImportError:  # Python < 3.11: the flat keys this file uses
        proj, section = {}, None
        with open(path) as f:
            for line in f:
                m = re.match(r"^\[(.+)\]\s*$", line)
                if m:
                    section = m.group(1)
                    continue
                m = re.match(r'^(\S+)\s*=\s*"(.*)"\s*$', line)
                if m and section == "project":
                    proj[m.group(1)] = m.group(2)
        return proj


def _metadata():
    p = _project()
    lines = ["Metadata-Version: 2.1", "Name: %s" % p["name"], "Version: %s" % p["version"]]
    if p.get("description"):
        lines.append("Summary: %s" % p["description"])
    if p.get("requires-python"):
        lines.append("Requires-Python: %s" % p["requires-python"])
    for extra, reqs in sorted((p.get("optional-dependencies") or {}).items()):
        lines.append("Provides-Extra: %s" % extra)
        lines += ['Requires-Dist: %s; extra == "%s"' % (r, extra) for r in reqs]
    body = ""
    readme = os.path.join(ROOT, "README.md")
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = "\n" + f.read()
    return p["name"], p["version"], "\n".join(lines) + "\n" + body


def _sources():
    """(path in the wheel, path on disk) of the package's files."""
    pkg = os.path.join(ROOT, "fa")
    for d, dirs, files in os.walk(pkg):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py") or f == "py.typed":
                full = os.path.join(d, f)
                yield os.path.relpath(full, ROOT).replace(os.sep, "/"), full


def _dist_info(name, version):
    return "%s-%s.dist-info" % (name, version)


def _write_wheel(wheel_directory, entries):
    """entries: (name in the zip, bytes). Adds WHEEL, METADATA, RECORD; returns the file name."""
    name, version, meta = _metadata()
    di = _dist_info(name, version)
    entries = list(entries) + [
        (di + "/METADATA", meta.encode()),
        (di + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: fa_build\nRoot-Is-Purelib: true\n"
                         "Tag: %s\n" % TAG).encode()),
        (di + "/top_level.txt", b"fa\n"),
    ]
    record = []
    for arc, data in entries:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (arc, digest, len(data)))
    record.append(di + "/RECORD,,")
    entries.append((di + "/RECORD", ("\n".join(record) + "\n").encode()))
    fname = "%s-%s-%s.whl" % (name, version, TAG)
    stamp = time.gmtime(int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")))[:6]
    with zipfile.ZipFile(os.path.join(wheel_directory, fname), "w",
                         zipfile.ZIP_DEFLATED) as z:
        for arc, data in entries:
            info = zipfile.ZipInfo(arc, stamp)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return fname


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    name, version, meta = _metadata()
    di = os.path.join(metadata_directory, _dist_info(name, version))
    os.makedirs(di, exist_ok=True)
    with open(os.path.join(di, "METADATA"), "w", encoding="utf-8") as f:
        f.write(meta)
    return os.path.basename(di)


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [(arc, _read(p)) for arc, p in _sources()])


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [("fa_editable.pth", (ROOT + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    name, version, meta = _metadata()
    base = "%s-%s" % (name, version)
    fname = base + ".tar.gz"
    files = [("pyproject.toml", os.path.join(ROOT, "pyproject.toml")),
             ("README.md", os.path.join(ROOT, "README.md")),
             ("_build/fa_build.py", os.path.abspath(__file__))] + list(_sources())
    with tarfile.open(os.path.join(sdist_directory, fname), "w:gz") as t:
        for arc, path in files:
            if os.path.exists(path):
                t.add(path, arcname=base + "/" + arc, recursive=False)
        data = meta.encode()
        info = tarfile.TarInfo(base + "/PKG-INFO")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return fname
