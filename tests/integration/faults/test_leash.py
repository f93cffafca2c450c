"""Who may own a local engine (issue 24; docs/security.md). The leash (`launch.leash`) is run here
as the local launcher runs it, with a real engine stand-in (a Python process that sleeps) and real processes:

- another user (uid 65534, as in the audit) who connects to the leash's socket and says `own` is
  refused (`SO_PEERCRED`), and the engine stays with its owner; before, that user got the released
  engine, root's next sweep was refused, and the engine stopped when that user hung up;
- the engine's command line, an API key on it included, is not readable in the leash's own
  /proc/PID/cmdline (it comes on the owner's channel);
- (issue 31) another user holding connections open to the socket does not hold up the owner's
  `own`; a leash that does not answer, or a state file others could have written, is refused in
  one line rather than adopted without the leash (`launch.local`; the local launcher on a Python
  `http.server` as its engine).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdexporter.errors import EngineError
from pdexporter.launch.base import terminate_group
from pdexporter.launch.local import LEASH, LocalLauncher
from pdexporter.measure.store import ResultsStore
from tests.helpers import alive, free_port, wait_until

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
            try:
                conn.sendall(b"own\n")
            except BrokenPipeError:  # refused at once, before anything was read (issue 31)
                pass
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


def _hold_connections_as(uid: int, name: str, count: int, hold_s: float) -> int:
    """A forked child of `uid` opens `count` connections to the leash's socket and says nothing
    on them for `hold_s` (the issue's other user); returns its pid once they are open."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            os.setgid(uid)
            os.setuid(uid)
            held = []
            for _ in range(count):
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conn.settimeout(5)
                conn.connect("\0" + name)
                held.append(conn)
            os.write(write, b"ready")
            time.sleep(hold_s)
        except BaseException as exc:  # noqa: BLE001 - said to the parent, which fails the test
            os.write(write, f"child failed: {exc!r}".encode())
        finally:
            os._exit(0)
    os.close(write)
    said = os.read(read, 256).decode(errors="replace")
    os.close(read)
    assert said == "ready", said
    return pid


@pytest.mark.skipif(os.getuid() != 0, reason="dropping to another uid needs root (CI runs as root)")
def test_another_user_holding_connections_open_does_not_hold_up_the_owner() -> None:
    """Issue 31: the leash read a foreign connection for up to 5 s before refusing it, one at a
    time; another user holding a few open made the owner's `own` time out, and the owner adopted
    the engine without its leash (it then outlived the owner's kill -9)."""
    leash, channel, said = _start_leash()
    engine = int(said["engine"])
    child = 0
    try:
        channel.sendall(b"release\n")
        channel.close()
        time.sleep(0.3)
        child = _hold_connections_as(65534, said["socket"], 6, hold_s=20)
        t0 = time.monotonic()
        ours = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.settimeout(10)
        ours.connect("\0" + said["socket"])
        ours.sendall(b"own\n")
        reply = ours.recv(64).decode()
        took = time.monotonic() - t0
        assert reply.startswith(f"ok {engine}") and took < 2.0, (reply, took)
        ours.close()  # owned, then gone without a release: the engine goes
        assert wait_until(lambda: not alive(engine), 20)
    finally:
        if child:
            os.kill(child, 9)
            os.waitpid(child, 0)
        leash.kill()
        leash.wait(10)


def _served_launcher(tmp_path: Path) -> LocalLauncher:
    served = tmp_path / "www" / "2048"
    served.mkdir(parents=True, exist_ok=True)
    (served / "health").write_text("")
    port = free_port()
    command = f"{{python}} -m http.server {port} --bind 127.0.0.1 --directory {tmp_path}/www/{{chunk}}"
    return LocalLauncher(command=command, store=ResultsStore(tmp_path / "results"), url=f"http://127.0.0.1:{port}",
                         health_timeout_s=20, stop_timeout_s=5)


async def test_an_engine_whose_leash_does_not_answer_is_not_adopted(tmp_path: Path) -> None:
    """Before: a leash that did not answer within 5 s (held up, or stopped) made the next run adopt
    its engine without it; that engine outlived the run's kill -9. A leash silent for 5 s is not
    asked again (three askings held the run 16 s)."""
    first = _served_launcher(tmp_path)
    await first.start(2048)
    state = first._state
    assert state is not None and state.leash_pid is not None
    first.release()
    os.kill(state.leash_pid, signal.SIGSTOP)  # alive, but it answers nothing
    try:
        second = _served_launcher(tmp_path)
        second.url, second.command = first.url, first.command
        t0 = time.monotonic()
        with pytest.raises(EngineError, match="does not answer; not adopting it without the leash"):
            await second.start(2048)
        assert time.monotonic() - t0 < 10.0  # one 5-s wait, not three
        assert not second.adopted and alive(state.pid)
    finally:
        os.kill(state.leash_pid, signal.SIGCONT)
        await terminate_group(state.pid, 5)


async def test_a_state_file_another_user_wrote_is_refused(tmp_path: Path) -> None:
    first = _served_launcher(tmp_path)
    await first.start(2048)
    state = first._state
    assert state is not None
    path = first.state_path(2048)
    first.release()
    try:
        path.chmod(0o666)  # anyone could have written it: its pid is not to be trusted
        second = _served_launcher(tmp_path)
        second.url, second.command = first.url, first.command
        with pytest.raises(EngineError, match="state file is writable by others"):
            await second.start(2048)
    finally:
        await terminate_group(state.pid, 5)
