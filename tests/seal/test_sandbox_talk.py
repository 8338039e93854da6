"""The harness's side of the child's pipes: whole lines in order, over-long ones cut, messages
sent whole, a child gone mid-answer, and a signal while the child is silent."""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time

import pytest

from leaderboard.seal import talk as sandbox_talk
from leaderboard.seal.talk import Channel, PipeLines


def _lines_of(chunks: list[bytes], limit: int, count: int) -> list[bytes]:
    """``count`` lines read at ``limit`` from a pipe the chunks arrive on one by one."""
    read, write = os.pipe()

    def feed():
        for chunk in chunks:
            os.write(write, chunk)
            time.sleep(0.05)  # each chunk its own read
        os.close(write)

    feeder = threading.Thread(target=feed)
    feeder.start()
    lines = PipeLines(read)
    try:
        return [lines.readline(limit) for _ in range(count)]
    finally:
        feeder.join()
        lines.close()


def test_lines_come_whole_and_in_order_whatever_the_chunks():
    assert _lines_of([b'{"a"', b': 1}\n{"b": 2}\n{"c"', b": 3}\n", b"partial"], 1000, 5) == [
        b'{"a": 1}\n', b'{"b": 2}\n', b'{"c": 3}\n', b"partial", b""]
    # a line of exactly the limit is whole; one more byte and it is cut, without its newline
    assert _lines_of([b"xxx\n", b"yyyy\n"], 4, 3) == [b"xxx\n", b"yyyy", b"\n"]


def test_an_over_long_message_is_counted_in_bytes(monkeypatch):
    monkeypatch.setattr(sandbox_talk, "MAX_MESSAGE", 8)
    # 11 bytes but 6 characters: counted in characters it would pass the check and be malformed
    channel = Channel(io.BytesIO("é".encode() * 5 + b"\n"), io.BytesIO())
    assert channel.receive() is None and "over 8 bytes" in channel.problems[0]


class _Trickle(io.RawIOBase):
    """A writer that takes at most 1000 bytes a call, as a raw write to a pipe may."""

    def __init__(self):
        self.taken = bytearray()

    def writable(self):
        return True

    def write(self, data):
        self.taken += bytes(data[:1000])
        return min(len(data), 1000)


def test_a_message_is_sent_whole_and_a_closed_pipe_is_no_error():
    message = {"unscored": ["c"] * 3_000}
    outbox = _Trickle()
    Channel(io.BytesIO(), outbox).send(message)
    assert json.loads(outbox.taken) == message
    gone_read, gone_write = os.pipe()
    os.close(gone_read)
    with os.fdopen(gone_write, "wb", buffering=0) as closed:
        Channel(io.BytesIO(), closed).send(message)  # the child is gone: nothing raised


class _Interrupted(Exception):
    pass


def test_a_signal_stops_the_wait_on_a_silent_child_whichever_thread_the_kernel_picked():
    def interrupted(signum, frame):
        raise _Interrupted  # not KeyboardInterrupt, which would end the whole pytest session

    read, write = os.pipe()
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    previous = signal.signal(signal.SIGINT, interrupted)  # also where SIGINT came in ignored
    late = threading.Timer(5.0, os.write, (write, b"late\n"))  # ends a wait that never wakes
    try:
        with pytest.raises(_Interrupted):
            # The kernel may deliver SIGINT to any thread: Python runs the handler on the main
            # thread only when it gets a turn, which a blocking read of a silent pipe never gives.
            threading.Timer(0.3, signal.pthread_kill, (other.ident, signal.SIGINT)).start()
            late.start()
            started = time.monotonic()
            PipeLines(read).readline(1000)
        assert time.monotonic() - started < 3.0
    finally:
        late.cancel()
        signal.signal(signal.SIGINT, previous)
        release.set()
        other.join()
        os.close(read)
        os.close(write)
