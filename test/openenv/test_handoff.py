"""The supervisor of ``serve --workers N`` hands each connection to the worker with the fewest
open connections, ties in turn, and past a worker that died (``openenv/_handoff``)."""

from __future__ import annotations

import socket

import pytest

from torchrl_trl_interop.openenv._handoff import ConnectionDispatcher

pytestmark = pytest.mark.skipif(not hasattr(socket, "send_fds"), reason="Unix only")


@pytest.fixture
def dispatcher():
    listening = socket.create_server(("127.0.0.1", 0))
    out = ConnectionDispatcher(listening, closed=[0, 0, 0])
    clients = []

    def connect():
        clients.append(socket.create_connection(listening.getsockname(), timeout=60))

    out.connect = connect
    yield out
    out.stop()
    for s in (*clients, listening):
        s.close()


def received(end):
    """The connection handed over ``end`` (a worker's), as a socket."""
    end.settimeout(60)
    _, fds, _, _ = socket.recv_fds(end, 8, 8)
    assert len(fds) == 1
    return socket.socket(fileno=fds[0])


def test_least_busy_worker_then_ties_in_turn(dispatcher):
    ends = [dispatcher.attach(i) for i in range(3)]
    dispatcher.start()
    for _ in range(4):
        dispatcher.connect()
    conns = [received(ends[i]) for i in (0, 1, 2, 0)]
    assert dispatcher.open_connections() == [2, 1, 1]
    dispatcher.closed[0] += 2  # worker 0 closed both of its connections
    dispatcher.connect()
    conns.append(received(ends[0]))  # the least busy, though not next in turn
    assert dispatcher.open_connections() == [1, 1, 1]
    for s in (*conns, *ends):
        s.close()


def test_a_dead_worker_is_passed_over_then_replaced(dispatcher):
    ends = [dispatcher.attach(i) for i in range(3)]
    dispatcher.start()
    ends[0].close()  # worker 0 died, not yet noticed: the hand-off to it fails
    dispatcher.connect()
    conn = received(ends[1])
    assert dispatcher.open_connections() == [0, 1, 0]
    dispatcher.detach(1)  # noticed dead: handed nothing more
    dispatcher.connect()
    conns = [conn, received(ends[2])]
    new = dispatcher.attach(0)  # its replacement starts with nothing open
    dispatcher.connect()
    conns.append(received(new))
    assert dispatcher.open_connections() == [1, 1, 1]
    for s in (*conns, new, *ends[1:]):
        s.close()
