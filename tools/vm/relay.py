"""One guest connection joined to a loopback port: QEMU's guestfwd `cmd:` runs this once per connection
the guest opens, with the connection on stdin and stdout (tools/vm/vm.py).
    python3 tools/vm/relay.py PORT
Standard library only; ends when either side closes."""

from __future__ import annotations

import os
import socket
import sys
import threading


def main(port: int) -> None:
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        return  # nothing listens (a case's "registry down"): the guest sees the connection closed
    sock.settimeout(None)

    def to_guest() -> None:
        while data := sock.recv(65536):
            os.write(1, data)
        os.close(1)

    reader = threading.Thread(target=to_guest, daemon=True)
    reader.start()
    while data := os.read(0, 65536):
        sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
    reader.join(timeout=600)  # the server's answer may still be on its way


if __name__ == "__main__":
    main(int(sys.argv[1]))
