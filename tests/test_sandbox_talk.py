"""The harness's side of the child's pipes: whole lines in order, over-long ones cut, a child
gone mid-answer, and Ctrl-C while the child is silent."""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time

import pytest

from leaderboard import sandbox_talk
from leaderboard.sandbox_talk import Channel, PipeLines


def _pipe_with(*chunks: bytes) -> int:
    read, write = os.pipe()
    for chunk in chunks:
        os.write(write, chunk)
    os.close(write)
    return read


def test_lines_come_whole_and_in_order_whatever_the_chunks():
    lines = PipeLines(_pipe_with(b'{"a"', b': 1}\n{"b": 2}\n{"c"', b": 3}\npartial"))
    assert [lines.readline(1000) for _ in range(5)] == [
        b'{"a": 1}\n', b'{"b": 2}\n', b'{"c": 3}\n', b"partial", b""]
    lines.close()
    cut = PipeLines(_pipe_with(b"x" * 10 + b"\nnext\n"))
    assert cut.readline(4) == b"xxxx"  # at the limit without a newline: over-long
    cut.close()


def test_an_over_long_message_is_named_in_bytes(monkeypatch):
    monkeypatch.setattr(sandbox_talk, "MAX_MESSAGE", 8)
    channel = Channel(io.BytesIO("é".encode() * 8 + b"\n"), io.BytesIO())
    assert channel.receive() is None and "over 8 bytes" in channel.problems[0]


def test_a_message_is_sent_whole_and_a_closed_pipe_is_no_error():
    read, write = os.pipe()
    received = []
    drain = threading.Thread(target=lambda: received.extend(iter(lambda: os.read(read, 4096), b"")))
    drain.start()
    message = {"unscored": ["c"] * 30_000}  # over a pipe's buffer: written in several parts
    with os.fdopen(write, "wb", buffering=0) as outbox:
        Channel(io.BytesIO(), outbox).send(message)
    drain.join()
    os.close(read)
    assert json.loads(b"".join(received)) == message
    gone_read, gone_write = os.pipe()
    os.close(gone_read)
    with os.fdopen(gone_write, "wb", buffering=0) as outbox:
        Channel(io.BytesIO(), outbox).send(message)  # the child is gone: nothing raised


def test_ctrl_c_stops_the_wait_on_a_silent_child_whichever_thread_the_kernel_picked():
    read, write = os.pipe()
    other = threading.Thread(target=time.sleep, args=(1,))
    other.start()
    # The kernel may deliver SIGINT to any thread: the handler runs on the main thread only
    # when it gets a turn, which a blocking read of a silent pipe never gives it.
    threading.Timer(0.3, signal.pthread_kill, (other.ident, signal.SIGINT)).start()
    late = threading.Timer(5.0, os.write, (write, b"late\n"))  # ends a wait that never wakes
    late.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            PipeLines(read).readline(1000)
        assert time.monotonic() - started < 2.0
    finally:
        late.cancel()
        other.join()
        os.close(read)
        os.close(write)
