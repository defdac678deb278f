"""A child process for the message-bus tests: ``python bus_worker.py MODE DB ARGS...``.

Modes:
- ``append DB SENDER COUNT THREAD...``: append COUNT messages to each thread in turn, then print
  ``done``.
- ``crash-append DB SENDER THREAD``: print ``ready``, then append forever, printing each
  acknowledged ``seq content`` line (the test kills it with SIGKILL).
- ``wait DB THREAD AFTER_SEQ``: print ``ready`` once subscribed, wait up to 30 s, print
  ``woken SEQ MONOTONIC_NS`` (or ``timeout``, or ``gone`` if the thread was deleted).
"""

from __future__ import annotations

import sys
import time

from agenthold.bus.messagebus import MessageBus, UnknownThreadError


def main(argv: list[str]) -> int:
    mode, db = argv[0], argv[1]
    with MessageBus(db) as bus:
        if mode == "append":
            sender, count, threads = argv[2], int(argv[3]), argv[4:]
            for n in range(count):
                for thread in threads:
                    bus.append(thread, sender, f"{sender} {n}")
            print("done", flush=True)
        elif mode == "crash-append":
            sender, thread = argv[2], argv[3]
            print("ready", flush=True)
            n = 0
            while True:
                message = bus.append(thread, sender, f"{sender} {n}")
                print(message.seq, message.content, flush=True)
                n += 1
        elif mode == "wait":
            thread, after = argv[2], int(argv[3])
            bus.poll(thread)  # open this thread's connection before saying ready
            print("ready", flush=True)
            try:
                page = bus.wait(thread, after_seq=after, timeout=30)
            except UnknownThreadError:
                print("gone", flush=True)
                return 0
            if page:
                print("woken", page[0].seq, time.monotonic_ns(), flush=True)
            else:
                print("timeout", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
