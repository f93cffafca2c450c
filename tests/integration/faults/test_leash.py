"""Who may own a local engine (issue 24; docs/security.md). The leash (`launch.leash`) is run here
as the local launcher runs it, with a real engine stand-in (a Python process that sleeps) and real processes:

- another user (uid 65534, as in the audit) who connects to the leash's socket and says `own` is
  refused (`SO_PEERCRED`), and the engine stays with its owner; before, that user got the released
  engine, root's next sweep was refused, and the engine stopped when that user hung up;
- the engine's command line, an API key on it included, is not readable in the leash's own
  /proc/PID/cmdline (it comes on the owner's channel).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdexporter.launch.local import LEASH
from tests.helpers import alive, wait_until

pytestmark = pytest.mark.integration

SECRET = "sk-leash-test-0123456789"


def _start_leash() -> tuple[subprocess.Popen[bytes], socket.socket, dict[str, str]]:
    ours, theirs = socket.socketpair()
    leash = subprocess.Popen(
        [sys.executable, "-I", str(LEASH), "--stop-timeout", "2"], stdin=theirs, stderr=subprocess.PIPE
    )
    theirs.close()
    engine = [sys.executable, "-c", "import time; time.sleep(120)", "--api-key", SECRET]
    ours.sendall(f"argv {json.dumps(engine)}\n".encode())
    said: dict[str, str] = {}
    ours.settimeout(20)
    buffer = b""
    while not {"engine", "socket"} <= said.keys():
        chunk = ours.recv(4096)
        assert chunk, leash.stderr.read() if leash.stderr else "the leash ended"
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            key, _, value = line.decode().partition(" ")
            said[key] = value
    return leash, ours, said


def _own_as(uid: int, name: str) -> str:
    """Connect to the leash's socket as `uid` (a forked child drops to it) and say `own`."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: another user of the machine
        try:
            os.close(read)
            os.setgid(uid)
            os.setuid(uid)
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(5)
            conn.connect("\0" + name)
            conn.sendall(b"own\n")
            reply = conn.recv(64) or b"(hung up)"
            os.write(write, reply)
            time.sleep(1.0)  # hold the connection a moment, as the audit's user did, then hang up
            conn.close()
        except BaseException as exc:  # noqa: BLE001 - said to the parent, which fails the test
            os.write(write, f"child failed: {exc!r}".encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    reply = os.read(read, 256).decode(errors="replace").strip()
    os.close(read)
    return reply


@pytest.mark.skipif(os.getuid() != 0, reason="dropping to another uid needs root (CI runs as root)")
def test_another_user_cannot_own_a_released_engine() -> None:
    leash, channel, said = _start_leash()
    engine = int(said["engine"])
    try:
        channel.sendall(b"release\n")
        channel.close()  # released: unowned, waiting for its next owner
        time.sleep(0.5)
        assert _own_as(65534, said["socket"]) == "not yours"
        time.sleep(1.5)
        assert alive(engine), "the engine stopped when the other user hung up"
        ours = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # its owner still may
        ours.settimeout(5)
        ours.connect("\0" + said["socket"])
        ours.sendall(b"own\n")
        assert ours.recv(64).decode().startswith(f"ok {engine}")
        ours.close()  # owned, then gone without a release: the engine goes
        assert wait_until(lambda: not alive(engine), 20)
    finally:
        leash.kill()
        leash.wait(10)


def test_the_engine_command_line_is_not_on_the_leashs_own() -> None:
    leash, channel, said = _start_leash()
    engine = int(said["engine"])
    try:
        leash_argv = Path(f"/proc/{leash.pid}/cmdline").read_bytes().split(b"\0")
        assert SECRET.encode() not in b" ".join(leash_argv) and b"--api-key" not in leash_argv
        assert b"time.sleep(120)" in Path(f"/proc/{engine}/cmdline").read_bytes()
    finally:
        channel.close()  # the owner is gone without a release: the leash stops the engine
        assert wait_until(lambda: not alive(engine), 20)
        leash.wait(10)
