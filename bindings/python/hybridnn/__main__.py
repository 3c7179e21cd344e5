"""python3 -m hybridnn COMMAND [flags]: the hybridnn tool's commands, run by the library.

The same commands, flags, output and exit statuses as the `hybridnn` executable (the C ABI's
hn_tool_main): train, test, time, device_query, convert; `python3 -m hybridnn help [COMMAND]`
lists them. Two differences, as a Python process must not re-run itself: OpenMP's idle
threads spin as long as its default unless GOMP_SPINCOUNT is set before Python starts (the
executable sets 1000: `GOMP_SPINCOUNT=1000 python3 -m hybridnn ...` does the same), and
under mpirun a rank that fails returns its error without ending the others at once (they
fail at their collective's deadline, --comm-timeout).
"""
import ctypes
import ctypes.util
import signal
import sys

from ._core import tool_main


_line_buffered = False


def line_buffered_stdout():
    """C's stdout line by line, as the executable has it: progress reaches a pipe as printed.
    Once, before the tool's first output (the only time setvbuf may be called)."""
    global _line_buffered
    if _line_buffered:
        return
    _line_buffered = True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        stream = ctypes.c_void_p.in_dll(libc, "stdout")
        libc.setvbuf(stream, None, 1, 0)  # _IOLBF
    except (OSError, ValueError, AttributeError):
        pass  # stdout stays as C buffers it; output still comes, at the end


def main(argv=None):
    arguments = sys.argv[1:] if argv is None else list(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    line_buffered_stdout()
    # Ctrl-C ends a command at once, as it does the executable (`train` routes SIGINT and
    # SIGTERM to a snapshot and a stop itself, and puts these handlers back after).
    previous = signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        return tool_main(["hybridnn", *arguments])
    finally:
        signal.signal(signal.SIGINT, previous)


if __name__ == "__main__":
    sys.exit(main())
