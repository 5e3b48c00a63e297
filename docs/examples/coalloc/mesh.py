"""Every process of a multi-part job finds every other one and opens a TCP connection to it.

Each process opens a TCP listener, waits at the start barrier, publishes its listener's
host:port through the rendezvous, and connects to every other process, which accept.
Run by the agent as part of a multi-part job (see docs/coallocation.md).
"""

import os
import socket
import sys
import threading

from proxy_agent import runtime

# The name the other processes reach this one by (MESH_HOST overrides it).
host = os.environ.get("MESH_HOST") or socket.gethostname()
listener = socket.socket()
listener.bind(("", 0))
listener.listen(64)
me = "%s:%d" % (host, listener.getsockname()[1])

# Nothing irreversible before the barrier: only now is every part known to be running.
passed = runtime.barrier(timeout=600)
part, rank = passed.part_index, runtime.rank()

# Level 1: each process registers with its part.  Rank 0 asks the agent to pass the
# part's data up to level 2, the whole job, where every process can read it.
runtime.register(me.encode())
if rank == 0:
    runtime.forward()
everyone = [item.decode() for item in runtime.rendezvous_items(level=2, timeout=600)]
others = [peer for peer in everyone if peer != me]

heard = []


def accept_all():
    for _ in others:
        connection, _ = listener.accept()
        with connection:
            heard.append(connection.makefile().readline().strip())


acceptor = threading.Thread(target=accept_all, daemon=True)
acceptor.start()
for peer in others:
    peer_host, peer_port = peer.rsplit(":", 1)
    with socket.create_connection((peer_host, int(peer_port)), timeout=30) as connection:
        connection.sendall(("part %d rank %d\n" % (part, rank)).encode())
acceptor.join(60)

print("part %d rank %d at %s: connected to %d peers, heard from %d" % (part, rank, me, len(others), len(heard)))
sys.exit(0 if len(heard) == len(others) else 1)
