"""A fork server for the ranks of a Python trainer on the CPU (harness/fork_server.h).

Every rank of an adapter's scenario would otherwise start a fresh interpreter and import PyTorch
again: 2 to 3.5 s of CPU a rank on the 2-core machine the docs measure, a large part of a small
row's time. pipecheck starts this server once per run, interpreter and trainer; it runs PRELOAD
(what an exec'd rank of the adapter runs first: its module-level imports) and then forks, for each rank the launcher asks for, a process that
becomes what `python ADAPTER` would have been: its log on stdout and stderr, its CPU binding, its
environment (the server's, which is the launcher's, plus the request's), argv, sys.path[0] the
adapter's folder, the adapter run as __main__ and its exit code the process's. Where
PIPECHECK_FORK_SERVER_LOG names a file, the server appends a line to it when it starts serving and
one for each rank it forks (tests/python_spawn_test.sh reads it).

The request and reply formats, the double fork that makes the rank the launcher's child, and the
signals are the C++ server's (harness/fork_server.cc). The server first answers whether it can
serve: 0 once PRELOAD ran and left no Python thread but this one (a rank forked beside another
could inherit its locks held), else minus an errno; the launcher then starts ranks by exec instead.
Native pools that the imports start and that mend themselves across fork (OpenBLAS's under
NumPy, jemalloc's background thread under PyArrow) are what Python's own fork start method meets
every day, and are allowed.

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


def become_rank(request, launcher):
    """In the rank: what exec'ing `python ADAPTER` would have made, then the adapter. Never returns."""
    argv, environment, log, cpus, bound_line = request
    code = 1
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
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for number in SIGNALS[1:]:
            signal.signal(number, signal.SIG_DFL)
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
        except BaseException:  # noqa: B902 - as the interpreter reports an uncaught exception
            traceback.print_exc()
            code = 1
        import atexit
        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def note(line):
    path = os.environ.get("PIPECHECK_FORK_SERVER_LOG")
    if path:
        with open(path, "a") as log:
            log.write(line + "\n")


def serve(server, launcher):
    for number in SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    while True:
        data = server.recv(1 << 20)
        if not data:
            os._exit(0)
        try:
            request = decode(data)
        except (ValueError, struct.error, UnicodeError):
            reply = -errno.EINVAL
        else:
            read_end, write_end = os.pipe()
            middle = os.fork()
            if middle == 0:
                os.close(read_end)
                try:
                    rank = os.fork()
                except OSError as error:
                    os.write(write_end, struct.pack("=q", -error.errno))
                    os._exit(0)
                if rank == 0:
                    os.close(write_end)
                    server.close()
                    become_rank(request, launcher)
                os.write(write_end, struct.pack("=q", rank))
                os._exit(0)
            os.close(write_end)
            got = os.read(read_end, 8)
            os.close(read_end)
            reply = struct.unpack("=q", got)[0] if len(got) == 8 else -errno.EPIPE
            os.waitpid(middle, 0)  # after which the rank is the launcher's child
            note(f"rank {reply} {' '.join(request[0][1:])}")
        try:
            server.send(struct.pack("=q", reply))
        except OSError:
            os._exit(0)


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
    serve(server, launcher)


if __name__ == "__main__":
    main()
