"""Least privilege: no shell-outs, no writes, and a non-root daemon without capabilities degrades (another
user's /proc/<pid>/io is unknown, not a failure) instead of failing."""

from __future__ import annotations

import ast
import base64
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "exporter"
# The simulator (``serve --simulate``) runs its scenario player as child processes of the daemon: the same
# Python, argv lists, no shell. Nothing else in the package may start a program.
# The simulator's renderer child, and py-spy for an opt-in capture (--capture.enabled, argv lists, no shell).
SPAWN_ALLOWED = {Path("sim/live.py"), Path("capture/runner.py")}
SPAWN_MODULES = {"subprocess", "pty", "multiprocessing"}
SPAWN_CALLS = {"system", "popen", "execv", "execve", "execl", "execle", "execlp", "execvp", "execvpe", "spawnv",
               "spawnl", "spawnve", "posix_spawn", "posix_spawnp", "fork", "forkpty"}


def _spawn_sites(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            out += [f"import {n}:{node.lineno}" for n in names if n.split(".")[0] in SPAWN_MODULES]
        elif isinstance(node, ast.Attribute) and node.attr in SPAWN_CALLS and isinstance(node.value, ast.Name) \
                and node.value.id == "os":
            out.append(f"os.{node.attr}:{node.lineno}")
        elif isinstance(node, ast.keyword) and node.arg == "shell":
            out.append(f"shell=:{node.value.lineno}")
    return out


def test_no_shell_outs_anywhere_in_the_package() -> None:
    found = {str(p.relative_to(PACKAGE)): s for p in sorted(PACKAGE.rglob("*.py")) if (s := _spawn_sites(p))}
    assert set(found) <= {str(p) for p in SPAWN_ALLOWED}, found
    for p in SPAWN_ALLOWED:
        assert not [s for s in found.get(str(p), []) if s.startswith(("shell=", "os."))], found


def test_the_scan_would_catch_a_shell_out(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os, subprocess\nos.system('ls')\nsubprocess.run('ls', shell=True)\n")
    assert _spawn_sites(bad) == ["import subprocess:1", "os.system:2", "shell=:3"]


@pytest.fixture
def world_readable() -> Iterator[Path]:
    """A directory the unprivileged user can read (pytest's tmp_path is root-only)."""
    d = Path(tempfile.mkdtemp(prefix="gpufeed-priv-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _drop_privileges() -> list[str]:
    """setpriv to nobody with no capabilities when we are root; [] otherwise (already unprivileged)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv not installed")
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs"]


def test_unprivileged_daemon_writes_nothing_spawns_nothing_and_degrades(world_readable: Path) -> None:
    cfg = world_readable / "web.yml"
    h = bcrypt.hashpw(b"scrape", bcrypt.gensalt(4)).decode()
    cfg.write_text(f"basic_auth_users: {{prometheus: '{h}'}}\n"
                   "http_server_config: {headers: {X-Content-Type-Options: nosniff}}\n")
    cfg.chmod(0o644)
    argv = [*_drop_privileges(), sys.executable, "-m", "tests.reliability.audit_child", "serve",
            "--web.listen-address=127.0.0.1:0", f"--web.config.file={cfg}", "--collector.proc.pids=1",
            "--web.render-interval=50ms", "--log.level=info"]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/nonexistent"}
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log: list[str] = []
    try:
        assert proc.stdout is not None
        port = 0
        deadline = time.monotonic() + 30
        while not port and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            log.append(line)
            m = re.search(r"event=listening .*address=[\d.]*:(\d+)", line)
            port = int(m.group(1)) if m else 0
        assert port, "".join(log)
        auth = "Basic " + base64.b64encode(b"prometheus:scrape").decode()
        body = ""
        for _ in range(60):  # until the proc collector has sampled pid 1
            req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": auth})
            with urllib.request.urlopen(req, timeout=5) as r:
                body = r.read().decode()
                assert r.headers["X-Content-Type-Options"] == "nosniff"
            if 'gpufeed_process_cpu_seconds_total{comm="' in body and 'pid="1"' in body:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
        log.append(out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    text = "".join(log)
    assert proc.returncode == 0, text
    assert "AUDIT" not in text, [ln for ln in text.splitlines() if "AUDIT" in ln]
    assert "event=web_config_reloaded" in text
    # pid 1 belongs to root: its CPU time is readable, its /proc/1/io is not (ptrace access check).
    assert re.search(r'^gpufeed_process_cpu_seconds_total\{[^}]*pid="1"[^}]*\} ', body, re.M), body[-2000:]
    assert not re.search(r'^gpufeed_process_read_bytes_total\{[^}]*pid="1"', body, re.M)
    assert 'gpufeed_collector_success{collector="proc"} 1.0' in body


def test_the_audit_hook_would_report_a_write_or_a_spawn(capfd: pytest.CaptureFixture[str]) -> None:
    from tests.reliability.audit_child import _hook

    _hook("open", ("/etc/x", "r", os.O_RDONLY))
    _hook("open", ("/var/lib/gpufeed/state", "w", os.O_WRONLY))
    _hook("open", ("/tmp/x", None, os.O_RDWR | os.O_CREAT))
    _hook("subprocess.Popen", ("sh", ["sh", "-c", "ls"], None, None))
    err = capfd.readouterr().err
    assert err.count("AUDIT") == 3 and "/etc/x" not in err
