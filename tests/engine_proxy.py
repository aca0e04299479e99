"""A Docker engine that goes away, for fault tests: a TCP proxy in front of the local engine's unix socket."""

from __future__ import annotations

import socket
import threading


class EngineProxy:
    """`tcp://127.0.0.1:<port>` in front of the local engine's unix socket. `cut()` drops the listener and every
    connection at once, as a Docker engine that died or a network that went away would look to the worker;
    `freeze()` keeps every connection open and accepts new ones but passes nothing on, as a host that hangs (a
    kernel stuck after a GPU Xid, a host powered off behind a switch) looks: each call waits for its timeout."""

    def __init__(self, upstream: str = "/var/run/docker.sock"):
        self.upstream, self.sockets, self.frozen = upstream, [], False
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.sockets.append(client)
            if self.frozen:  # held open, never answered
                continue
            engine = socket.socket(socket.AF_UNIX)
            engine.connect(self.upstream)
            self.sockets.append(engine)
            for a, b in ((client, engine), (engine, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a, b):
        try:
            while data := a.recv(65536):
                if not self.frozen:
                    b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(2)
                except OSError:
                    pass

    def freeze(self):
        self.frozen = True

    def cut(self):
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked in the other thread
        self.listener.close()
        for s in self.sockets:
            try:
                s.shutdown(2)
                s.close()
            except OSError:
                pass
