"""A fork server for the ranks of a Python trainer on the CPU (harness/fork_server.h).

Every rank of an adapter's scenario would otherwise start a fresh interpreter and import PyTorch
again: 2 to 3.5 s of CPU a rank on the 2-core machine the docs measure, a large part of a small
row's time. pipecheck starts this server once per run, interpreter and trainer; it runs PRELOAD
(what an exec'd rank of the adapter runs first: its module-level imports) and then forks, for each
rank the launcher asks for, a process that becomes what `python ADAPTER` would have been: its log
on stdout and stderr, its CPU binding, its environment (the server's, which is the launcher's,
plus the request's), argv, sys.path[0] the adapter's folder, its signal dispositions, the adapter
run as __main__, the interpreter's ending (threads joined, exit handlers, the exit code, death by
SIGINT after an uncaught KeyboardInterrupt). What a fork cannot give a rank of its own: its
string-hash seed (every rank has the server's), its stdin (/dev/null), its /proc cmdline (this
script's). Where PIPECHECK_FORK_SERVER_LOG names a file, the server appends a line to it when it
starts serving and one for each rank it forks (tests/python_spawn_test.sh reads it).

The request and reply formats, the double fork that makes the rank the launcher's child, and the
signals are the C++ server's (harness/fork_server.cc), with one step more: a rank runs nothing
until the launcher, holding its pid, sends a go-ahead byte, so that a reply lost to a timeout or a
signal cannot leave it running beside the rank the launcher then starts by exec. The server first
answers whether it can serve: 0 once PRELOAD ran and left no Python thread but this one (a rank
forked beside another could inherit its locks held), else minus an errno; the launcher then starts
ranks by exec instead. Native pools that the imports start and that mend themselves across fork
(OpenBLAS's under NumPy, jemalloc's background thread under PyArrow) are what Python's own fork
start method meets every day, and are allowed.

    fork_server.py FD LAUNCHER_PID PRELOAD
"""
import ctypes
import errno
import os
import runpy
import signal
import socket
import struct
import sys
import threading
import time
import traceback

PR_SET_PDEATHSIG = 1
# The signals the server ignores (the launcher ends it) and a rank gets back as a fresh interpreter
# has them: SIGINT raising KeyboardInterrupt, the others their default action.
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def die_with_parent():
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def decode(data):
    """SpawnRequest: argv, environment, log, cpus, bound_line (harness/fork_server.cc Encode)."""
    at = 0

    def text():
        nonlocal at
        (length,) = struct.unpack_from("=I", data, at)
        at += 4
        value = data[at:at + length]
        if len(value) != length:
            raise ValueError("truncated request")
        at += length
        return value.decode("utf-8", "surrogateescape")

    argv = [text() for _ in range(int(text()))]
    environment = [(text(), text()) for _ in range(int(text()))]
    log = text()
    cpus = [int(text()) for _ in range(int(text()))]
    bound_line = text()
    if not argv:
        raise ValueError("no argv")
    return argv, environment, log, cpus, bound_line


def become_rank(request, launcher, go, dispositions):
    """In the rank: what exec'ing `python ADAPTER` would have made, then the adapter. Never returns."""
    argv, environment, log, cpus, bound_line = request
    code, interrupted = 1, False
    try:
        # The middle process exits at once and this one becomes the launcher's child; then die with it.
        deadline = time.monotonic() + 2.0
        while os.getppid() != launcher:
            if time.monotonic() > deadline:
                os._exit(126)
            time.sleep(0.0001)
        die_with_parent()
        if os.getppid() != launcher:
            os._exit(126)
        # Nothing runs before the launcher, holding this rank's pid, says so (else it starts the
        # rank by exec, and this one must not run beside it).
        if os.read(go, 1) != b"\x01":
            os._exit(126)
        os.close(go)
        for number, disposition in dispositions.items():
            if disposition is not None:  # None: a handler not set from Python, left as it is
                signal.signal(number, disposition)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        if cpus:
            try:
                os.sched_setaffinity(0, cpus)
                os.write(2, bound_line.encode())
            except OSError:
                pass
        for name, value in environment:
            os.environ[name] = value
        script = os.path.abspath(argv[1])
        sys.argv = argv[1:]
        sys.path[0] = os.path.dirname(script)
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as done:
            # As the interpreter ends on SystemExit: None is 0, an int its code, else printed and 1.
            if done.code is None:
                code = 0
            elif isinstance(done.code, int):
                code = done.code
            else:
                print(done.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            # As the interpreter: the traceback, then (after the exit handlers) death by SIGINT.
            sys.excepthook(*sys.exc_info())
            interrupted = True
        except BaseException:  # noqa: B902 - as the interpreter reports an uncaught exception
            sys.excepthook(*sys.exc_info())
            code = 1
        # The interpreter's own ending: non-daemon threads joined, then the exit handlers.
        threading._shutdown()
        import atexit
        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            if interrupted:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGINT)
            os._exit(code & 0xFF)


def note(line):
    """A line in PIPECHECK_FORK_SERVER_LOG where it names a file; a log that cannot be written is
    no reason to stop serving."""
    path = os.environ.get("PIPECHECK_FORK_SERVER_LOG")
    if path:
        try:
            with open(path, "a") as log:
                log.write(line + "\n")
        except OSError:
            pass


def fork_rank(request, launcher, server, dispositions):
    """Forks the rank through a middle process that exits at once; returns (its pid or minus an
    errno, the write end of its go-ahead pipe or None)."""
    try:
        read_end, write_end = os.pipe()
        go_read, go_write = os.pipe()
        middle = os.fork()
    except OSError as error:
        return -(error.errno or errno.EIO), None
    if middle == 0:
        os.close(read_end)
        try:
            rank = os.fork()
        except OSError as error:
            os.write(write_end, struct.pack("=q", -(error.errno or errno.EIO)))
            os._exit(0)
        if rank == 0:
            os.close(write_end)
            os.close(go_write)
            server.close()
            become_rank(request, launcher, go_read, dispositions)
        os.write(write_end, struct.pack("=q", rank))
        os._exit(0)
    os.close(write_end)
    os.close(go_read)
    got = os.read(read_end, 8)
    os.close(read_end)
    os.waitpid(middle, 0)  # after which the rank is the launcher's child
    reply = struct.unpack("=q", got)[0] if len(got) == 8 else -errno.EPIPE
    if reply <= 0:
        os.close(go_write)
        return reply, None
    return reply, go_write


def serve(server, launcher, dispositions):
    while True:
        data = server.recv(1 << 20)
        if not data:
            os._exit(0)
        go = None
        try:
            request = decode(data)
        except (ValueError, struct.error, UnicodeError):
            reply = -errno.EINVAL
        else:
            reply, go = fork_rank(request, launcher, server, dispositions)
            note(f"rank {reply} {' '.join(request[0][1:])}")
        try:
            server.send(struct.pack("=q", reply))
            # The launcher's go-ahead, once it holds the rank; without it the rank ends unstarted.
            if go is not None and server.recv(1) == b"\x01":
                os.write(go, b"\x01")
        except OSError:
            os._exit(0)
        finally:
            if go is not None:
                os.close(go)


def main():
    fd, launcher, preload = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    die_with_parent()
    if os.getppid() != launcher:
        os._exit(0)
    server = socket.socket(fileno=fd)
    ready = 0
    try:
        exec(compile(preload, "<preload>", "exec"), {"__name__": "__preload__"})
        if threading.active_count() != 1:
            ready = -errno.EAGAIN
    except BaseException:  # noqa: B902 - any failure: the launcher starts ranks by exec instead
        ready = -errno.ENOEXEC
    sys.stdout.flush()
    sys.stderr.flush()
    server.send(struct.pack("=q", ready))
    if ready != 0:
        os._exit(0)
    note(f"server {os.getpid()} {sys.executable} preloaded: {preload}")
    # What a fresh interpreter started by the launcher would have (SIGINT raising
    # KeyboardInterrupt, or ignored where the launcher ignores it): each rank gets it back.
    dispositions = {number: signal.getsignal(number) for number in SIGNALS}
    for number in SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    serve(server, launcher, dispositions)


if __name__ == "__main__":
    main()
