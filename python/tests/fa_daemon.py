"""A real fa-daemon for the tests, on a private socket, as tests/helpers/fa_test.c starts one:
fork/exec $FA_BUILD/fa-daemon --socket DIR/s with NOTIFY_SOCKET set, wait for READY=1 (bounded),
stop it with SIGTERM and a bounded wait. The daemon's log stays in DIR/daemon.log."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def build_dir():
    b = os.environ.get("FA_BUILD", "build")
    return b if os.path.isabs(b) else os.path.join(REPO, b)


def scale():
    """FA_TEST_TIMEOUT_SCALE, as the C tests read it (slow machines, sanitizers)."""
    try:
        return max(1.0, float(os.environ.get("FA_TEST_TIMEOUT_SCALE", "1")))
    except ValueError:
        return 1.0


class Daemon:
    def __init__(self, *extra, backend="cpu", sock=None):
        self.dir = tempfile.mkdtemp(prefix="fa-py.")
        self.sock = sock or os.path.join(self.dir, "s")
        self.url = "ipc://" + self.sock
        self.log = os.path.join(self.dir, "daemon.log")
        notify = os.path.join(self.dir, "n")
        ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        ns.bind(notify)
        env = dict(os.environ, NOTIFY_SOCKET=notify)
        env.pop("FA_SOCKET", None)
        binary = os.path.join(build_dir(), "fa-daemon")
        args = [binary, "--socket", self.sock, "--backend", backend] + list(extra)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 20 * scale()
        ready = False
        try:
            while not ready:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    break
                ns.settimeout(min(left, 0.05))
                try:
                    msg = ns.recv(4096).decode(errors="replace")
                except socket.timeout:
                    continue
                ready = "READY=1" in msg.splitlines()
        finally:
            ns.close()
        if not ready:
            self.stop()
            raise RuntimeError("fa-daemon did not become ready; log:\n" + self.read_log())

    def read_log(self):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self, timeout=10):
        """SIGTERM, a bounded wait, SIGKILL after it; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout * scale())
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
