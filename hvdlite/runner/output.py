"""How hvdliterun forwards its ranks' output: rank-prefixed lines, and '\\r' progress bars
rendered as a user expects.

Each rank's stdout and its stderr is a *source*: a byte stream cut into lines at '\\n'. A '\\r'
moves the source's cursor back to the start of its current line and the text after it
overwrites that line, as on a terminal (tqdm and friends draw their bars this way). So:

- a completed line (ended by '\\n', or by the end of the stream) is printed once, prefixed, as
  a terminal would show it: "a\\rb\\n" prints "b", "hello\\r\\n" prints "hello";
- to a terminal (our stdout / stderr is a TTY): the line a source is still writing is drawn
  live on the bottom row, prefixed, cut to the terminal's width and redrawn at each update;
  completed lines of every rank are printed above it. One live row at a time: the source that
  wrote last owns it. Erasing a line (tqdm's leave=False) erases the row.
- to a pipe or file: no '\\r' is forwarded, every printed line is a whole line. A line being
  rewritten with '\\r' is printed when it completes, when it is about to be erased (a bar with
  leave=False leaves its final state in the log), and at most once every
  PIPE_PROGRESS_INTERVAL_S while it keeps changing (a long epoch still shows progress in
  `tail -f`). Never one giant line of every update.

Threading: one Console is shared by every reader thread of a job; its lock serializes every
write, so lines of different ranks never interleave and the live row is erased and redrawn
around them. Writes never raise: once our own output is gone (closed pipe) they are dropped
and the readers keep draining the ranks.
"""

import codecs
import os
import re
import threading
import time

PIPE_PROGRESS_INTERVAL_S = 10.0  # to a pipe: a line being rewritten is printed at most this often
_READ_BYTES = 65536
_SPLIT = re.compile(r"([\r\n])")
_ERASE_ROW = b"\r\x1b[K"  # carriage return, then erase to the end of the row (VT100, every terminal)


class _Stream:
    """One of our output streams (stdout or stderr) and whether it is a terminal."""

    def __init__(self, console, stream):
        self.console = console
        self.raw = getattr(stream, "buffer", stream)
        try:
            self.fd = stream.fileno()
            self.tty = os.isatty(self.fd)
        except (AttributeError, OSError, ValueError):
            self.fd, self.tty = None, False

    def width(self):
        """The terminal's width in columns (80 when it cannot be asked or says 0)."""
        try:
            columns = os.get_terminal_size(self.fd).columns if self.fd is not None else 0
        except OSError:
            columns = 0
        return columns if columns > 0 else 80

    def emit(self, data):
        """Writes and flushes; the console's lock is held by the caller."""
        try:
            self.raw.write(data)
            self.raw.flush()
        except (OSError, ValueError):
            pass  # our own output is gone (closed pipe): keep draining the ranks anyway

    def write(self, data):
        """Writes whole lines (our own messages) above the live row."""
        with self.console.lock:
            self.console.print_above(self, data)

    def source(self, prefix):
        """A new source printed to this stream with `prefix` (bytes) before each line."""
        return Source(self, prefix)


class Console:
    """Our stdout and stderr, shared by every reader thread of a job."""

    def __init__(self, stdout, stderr):
        self.lock = threading.Lock()
        self.stdout = _Stream(self, stdout)
        self.stderr = _Stream(self, stderr)
        self.live = None  # the Source whose unfinished line is drawn on the terminal's bottom row

    def _erase_live(self):
        if self.live is not None:
            self.live.stream.emit(_ERASE_ROW)

    def _draw_live(self):
        src = self.live
        if src is not None:
            row = src.prefix_text + src.line.rstrip()
            row = row[: max(1, src.stream.width() - 1)]  # one row: a wrapped row could not be erased
            src.stream.emit(_ERASE_ROW + row.encode("utf-8", "surrogateescape"))

    def print_above(self, stream, data):
        """Prints complete lines on `stream`, above the live row when there is one. Lock held."""
        self._erase_live()
        stream.emit(data)
        self._draw_live()

    def drop_live(self, src):
        """Erases `src`'s live row, if it has it. Lock held."""
        if self.live is src:
            self._erase_live()
            self.live = None

    def show_live(self, src):
        """Makes `src`'s unfinished line the live row (or drops it when blank). Lock held."""
        if src.line.strip():
            if self.live is not None and self.live.stream is not src.stream:
                self._erase_live()
            self.live = src
            self._draw_live()
        else:
            self.drop_live(src)


class Source:
    """One rank's stdout or stderr. feed() is called by one reader thread only."""

    def __init__(self, stream, prefix):
        self.stream = stream
        self.console = stream.console
        self.prefix = prefix
        self.prefix_text = prefix.decode("utf-8", "surrogateescape")
        self._decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self.line = ""  # what a terminal would show on this source's current row
        self._cursor = 0
        self._rewritten = False  # a '\r' went back over the current line
        self._drawn = ""  # the line as it was at the last '\r': a complete state of a bar
        self._printed = None  # to a pipe: the last state of the current line we printed
        self._printed_at = 0.0

    def pump(self, pipe):
        """Copies the binary pipe `pipe` to our console until EOF, then closes it."""
        with pipe:
            while True:
                data = pipe.read1(_READ_BYTES) if hasattr(pipe, "read1") else pipe.read(_READ_BYTES)
                if not data:
                    break
                self.feed(data)
        self.feed(b"", final=True)

    def feed(self, data, final=False):
        text = self._decoder.decode(data, final)
        with self.console.lock:
            for piece in _SPLIT.split(text):
                if piece == "\n":
                    self._end_line()
                elif piece == "\r":
                    self._carriage_return()
                elif piece:
                    self._overwrite(piece)
            if final:
                if self.line.strip():
                    self._end_line()
                elif self._rewritten and not self.stream.tty:
                    self._erased()
                self.console.drop_live(self)
            elif self.stream.tty:
                self.console.show_live(self)

    # -- the terminal model of one row ------------------------------------------------------
    def _overwrite(self, text):
        end = self._cursor + len(text)
        self.line = self.line[: self._cursor] + text + self.line[end:]
        self._cursor = end

    def _carriage_return(self):
        if not self.stream.tty:
            now = time.monotonic()
            if not self._rewritten:
                self._printed_at = now  # the interval starts at the line's first '\r'
            elif not self.line.strip():
                self._erased()
            elif now - self._printed_at >= PIPE_PROGRESS_INTERVAL_S:
                self._print(self.line.rstrip())
        if self.line.strip():
            self._drawn = self.line
        self._rewritten = True
        self._cursor = 0

    def _erased(self):
        """To a pipe: the line went blank; its last drawn state is printed unless it was."""
        drawn = self._drawn.rstrip()
        if drawn and drawn != self._printed:
            self._print(drawn)
        self._drawn = ""

    def _end_line(self):
        line = self.line.rstrip() if self._rewritten else self.line
        if not (self._rewritten and line == self._printed):  # not a repeat of its last snapshot
            self.console.drop_live(self)
            self.console.print_above(self.stream, self._encode(line))
        self.line, self._cursor, self._rewritten, self._drawn, self._printed = "", 0, False, "", None

    def _print(self, line):
        self.console.print_above(self.stream, self._encode(line))
        self._printed = line
        self._printed_at = time.monotonic()

    def _encode(self, line):
        return self.prefix + line.encode("utf-8", "surrogateescape") + b"\n"
