"""The leash: a small process between a local engine and the pdexporter that owns it (Linux).

Run by path with the interpreter isolated (`python -I leash.py --stop-timeout S`; it imports only
the standard library and `pdexporter._internal.procs`, so an engine's environment cannot break
it), with a connected socket as its stdin: the *owner's channel*. The engine's command line comes
on that channel (`argv JSON` on the first line), not on the leash's own: an API key on it would
otherwise be readable in the leash's /proc/PID/cmdline by every user of the machine. It starts the
engine in its own session, with a parent-death signal (`prctl(PR_SET_PDEATHSIG, SIGTERM)`: if
the leash dies, even by SIGKILL, the kernel stops the engine), says `engine PID` and `socket NAME`
on the channel, and then:

- the owner's channel reaches EOF (the owner exited, was killed with SIGKILL, crashed) without
  `release` having been said on it: the engine's process group gets SIGTERM, then SIGKILL after
  the stop timeout, and the leash exits. So a sweep killed at any moment takes its engine with it;
- `release` was said first (a sweep stopping at `--deadline`, `--keep-engine`, or starting the
  next chunk size's engine for the next run): the leash keeps the engine, unowned, for a later
  invocation to adopt;
- a later invocation connects to `socket NAME` (an abstract unix socket, named in the engine's
  state file) and says `own`: answered `ok PID`, that connection is the owner's channel from now
  on, with the same rules; `busy` when a live owner holds the engine (two sweeps on one results
  directory). Only a process of the leash's own user may: the kernel says who is at the other end
  (`SO_PEERCRED`), and any other uid is answered `not yours` and hung up on at once, before
  anything is read from it. (An abstract socket has no file whose mode could say so; it also leaves
  nothing behind when the leash is killed.) No connection can hold the leash up: every pending
  connection waits in the selector, not in a blocking read, and is dropped after
  `REQUEST_TIMEOUT_S` without a request (a foreign user holding connections open made the owner's
  `own` time out, and the owner adopted its engine without the leash: issue 31);
- the engine exits (or is stopped by its owner, `terminate_group`): the leash exits with it;
- SIGTERM, SIGINT or SIGHUP to the leash: the engine is stopped first.

`pdexporter.launch.local` starts it and speaks this protocol; docs/sweep.md ("Engines die with
their sweep") says what a user sees.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "Leash", "REQUEST_TIMEOUT_S", "main", "peer_uid",
]

if __name__ == "__main__":  # run by path (`python -I`): the package is found beside this file
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pdexporter._internal.procs import die_with_parent  # the standard library only

REQUEST_TIMEOUT_S = 5.0  # a connection that says nothing this long is dropped


def _stop_group(pid: int, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        if proc.poll() is not None:
            break
    try:
        os.killpg(pid, signal.SIGKILL)  # workers the engine left in its group
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        pass


class Leash:
    """The leash's state: the engine, its owner's channel (None: unowned), whether it was released."""

    def __init__(self, engine: subprocess.Popen[bytes], channel: socket.socket, stop_timeout_s: float,
                 say: Callable[[str], None]) -> None:
        self.owner: socket.socket | None  # None: unowned
        self.engine, self.owner, self.stop_timeout_s, self.say = engine, channel, stop_timeout_s, say
        self.released = False
        self.selector = selectors.DefaultSelector()
        self.selector.register(channel, selectors.EVENT_READ, "owner")
        self.pending: dict[socket.socket, float] = {}  # connections of our uid, not heard yet: their deadline

    def owner_says(self, wait_s: float = 0.0) -> str:
        """Read what the owner sent: "" (nothing that matters) or "gone" (EOF: it exited)."""
        owner = self.owner
        assert owner is not None
        owner.settimeout(wait_s)
        try:
            data = owner.recv(4096)
        except (TimeoutError, BlockingIOError):
            return ""
        except OSError:
            data = b""
        if b"release" in data:
            self.released = True
        if data:
            return ""
        self.selector.unregister(owner)
        owner.close()
        self.owner = None
        return "gone"

    def owner_gone(self) -> bool:
        """The owner's channel ended: keep a released engine (True), else stop it (False: exit)."""
        if self.released:
            self.say(f"engine pid {self.engine.pid} released: kept running for a later run to adopt")
            return True
        self.say(f"its owner is gone without releasing engine pid {self.engine.pid}: stopping it")
        _stop_group(self.engine.pid, self.stop_timeout_s, self.engine)
        return False

    def accept(self, conn: socket.socket) -> None:
        """A new connection on the socket: another uid is refused at once (nothing is read from
        it, so it cannot hold the leash); ours waits in the selector for its request."""
        uid = peer_uid(conn)
        if uid != os.getuid():
            self.say(f"refused a connection from uid {uid}: the engine belongs to uid {os.getuid()}")
            with contextlib.suppress(OSError):
                conn.setblocking(False)
                conn.send(b"not yours\n")
            conn.close()
            return
        conn.setblocking(False)
        self.pending[conn] = time.monotonic() + REQUEST_TIMEOUT_S
        self.selector.register(conn, selectors.EVENT_READ, "pending")

    def drop_stale(self) -> None:
        """Connections that said nothing within `REQUEST_TIMEOUT_S`: hung up on."""
        now = time.monotonic()
        for conn, deadline in list(self.pending.items()):
            if now > deadline:
                self._unpend(conn)
                conn.close()

    def _unpend(self, conn: socket.socket) -> None:
        self.pending.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(conn)

    def request(self, conn: socket.socket) -> bool:
        """A pending connection spoke (or hung up); False when the leash is to exit."""
        self._unpend(conn)
        try:
            request = conn.recv(64).decode(errors="replace").strip()
            conn.settimeout(5.0)
            # A release and the EOF its owner sent just before may still wait to be read.
            if self.owner is not None and self.owner_says(0.5) == "gone" and not self.owner_gone():
                conn.close()
                return False
            if request != "own":
                conn.sendall(b"what?\n")
            elif self.owner is not None:
                conn.sendall(b"busy\n")
            else:
                conn.sendall(f"ok {self.engine.pid}\n".encode())
                conn.settimeout(None)
                self.owner, self.released = conn, False
                self.selector.register(conn, selectors.EVENT_READ, "owner")
                self.say(f"engine pid {self.engine.pid} adopted by a new owner")
                return True
        except OSError:
            pass
        conn.close()
        return True


def peer_uid(conn: socket.socket) -> int | None:
    """The uid of the process at the other end of a unix socket (`SO_PEERCRED`: pid, uid, gid)."""
    try:
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except OSError:
        return None
    return int(uid)


def _read_argv(channel: socket.socket) -> list[str]:
    """The engine's command line: `argv JSON` on the channel's first line (module docs)."""
    data = b""
    channel.settimeout(30.0)
    while b"\n" not in data:
        chunk = channel.recv(65536)
        if not chunk:
            break
        data += chunk
    channel.settimeout(None)
    line = data.split(b"\n", 1)[0].decode(errors="replace")
    if not line.startswith("argv "):
        return []
    argv = json.loads(line[5:])
    return [str(word) for word in argv] if isinstance(argv, list) else []


def _options(argv: list[str]) -> tuple[float, list[str]]:
    """`[--stop-timeout S] [--] [ENGINE ARGV...]`: the stop timeout and the engine's command line."""
    stop_timeout_s = 60.0
    if argv[:1] == ["--stop-timeout"]:
        stop_timeout_s, argv = float(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    return stop_timeout_s, argv


def _start_engine(argv: list[str], channel: socket.socket) -> subprocess.Popen[bytes] | None:
    """The engine started in its own session (the command line read from the channel when none was
    given); None, with the error said on the channel, when there is none or it cannot start."""
    if not argv:  # the command line comes on the channel, not on ours
        try:
            argv = _read_argv(channel)
        except (OSError, ValueError):
            argv = []
        if not argv:
            channel.sendall(b"error no engine command line on the channel\n")
            return None
    try:
        # preexec_fn only calls prctl in the child (die_with_parent); the leash has no other thread
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=die_with_parent(signal.SIGTERM))  # noqa: PLW1509
    except OSError as exc:
        channel.sendall(f"error {exc.strerror or exc}\n".encode())
        return None


def _say(text: str) -> None:
    sys.stderr.write(f"# pdexporter leash (pid {os.getpid()}): {text}\n")
    sys.stderr.flush()


def main(argv: list[str]) -> int:
    stop_timeout_s, argv = _options(argv)
    channel = socket.socket(fileno=0)
    engine = _start_engine(argv, channel)
    if engine is None:
        return 127
    name = f"pdexporter-leash-{os.getpid()}-{secrets.token_hex(6)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(64)
    listener.setblocking(False)
    channel.sendall(f"engine {engine.pid}\nsocket {name}\n".encode())
    stopping: list[str] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: stopping.append(signal.Signals(signum).name))
    leash = Leash(engine, channel, stop_timeout_s, _say)
    leash.selector.register(listener, selectors.EVENT_READ, "listener")
    while engine.poll() is None:
        if stopping:
            _say(f"{stopping[0]}: stopping engine pid {engine.pid}")
            _stop_group(engine.pid, stop_timeout_s, engine)
            return 0
        leash.drop_stale()
        if not all(_serve(key, listener, leash) for key, _ in leash.selector.select(timeout=0.5)):
            return 0
    return 0


def _serve(key: selectors.SelectorKey, listener: socket.socket, leash: Leash) -> bool:
    """One ready connection served; False once the leash has nothing left to hold."""
    if key.data == "listener":
        _accept_all(listener, leash)
        return True
    if key.data == "pending":
        return leash.request(key.fileobj)  # type: ignore[arg-type]
    return not (leash.owner is not None and leash.owner_says() == "gone" and not leash.owner_gone())


def _accept_all(listener: socket.socket, leash: Leash) -> None:
    """Every connection waiting on the listener (a flood of them empties the backlog at once)."""
    while True:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return
        leash.accept(conn)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
