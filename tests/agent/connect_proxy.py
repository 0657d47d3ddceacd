"""A small forward proxy on 127.0.0.1 for the agent's proxy tests, like a corporate one.

``CONNECT host:port`` opens a tunnel (what a client does for https); an absolute-form request
(``POST http://host:port/path``) is forwarded (what a client does for plain http). It records
what it was asked, can demand ``Proxy-Authorization`` (answering 407 without it), and can refuse
every tunnel (403), so the tests see the agent's behaviour behind a real proxy on a real socket.
"""

import base64
import http.client
import select
import socket
import socketserver
import threading
from urllib.parse import urlsplit


class ConnectProxy:
    def __init__(self, *, credentials=None, refuse=False):
        """``credentials``: "user:password" the proxy demands; ``refuse``: answer 403 to CONNECT."""
        self.connects = []  # "host:port" of every tunnel asked for
        self.forwarded = []  # absolute URLs of every plain-http request forwarded
        self.authorizations = []  # Proxy-Authorization values seen
        self.expected = None
        if credentials:
            self.expected = "Basic " + base64.b64encode(credentials.encode()).decode()
        self.refuse = refuse
        self._lock = threading.Lock()
        proxy = self

        class Handler(socketserver.StreamRequestHandler):
            # Unbuffered: nothing a tunnelling client sends may sit in a read buffer.
            rbufsize = 0

            def handle(self):
                proxy._serve(self)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

            def handle_error(self, request, client_address):
                pass  # clients hanging up mid-stream is normal for a proxy

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()

    # --- serving -----------------------------------------------------------------------------

    @staticmethod
    def _read_head(rfile):
        request_line = rfile.readline(65537).decode("latin-1").rstrip("\r\n")
        headers = []
        while True:
            line = rfile.readline(65537).decode("latin-1").rstrip("\r\n")
            if not line:
                break
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
        return request_line, headers

    def _authorised(self, handler, headers):
        value = next((v for n, v in headers if n.lower() == "proxy-authorization"), None)
        with self._lock:
            if value is not None:
                self.authorizations.append(value)
        if self.expected is not None and value != self.expected:
            handler.wfile.write(
                b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                b'Proxy-Authenticate: Basic realm="test"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n'
            )
            return False
        return True

    def _serve(self, handler):
        while True:
            request_line, headers = self._read_head(handler.rfile)
            if not request_line:
                return
            method, target, _version = request_line.split(" ", 2)
            if not self._authorised(handler, headers):
                return
            if method == "CONNECT":
                self._tunnel(handler, target)
                return
            if not self._forward(handler, method, target, headers):
                return

    def _tunnel(self, handler, target):
        with self._lock:
            self.connects.append(target)
        if self.refuse:
            handler.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        host, _, port = target.rpartition(":")
        try:
            upstream = socket.create_connection((host, int(port)), timeout=10)
        except OSError:
            handler.wfile.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        handler.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        handler.wfile.flush()
        client = handler.connection
        with upstream:
            sockets = [client, upstream]
            while True:
                readable, _, _ = select.select(sockets, [], [], 30)
                if not readable:
                    return
                for source in readable:
                    try:
                        data = source.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    (upstream if source is client else client).sendall(data)

    def _forward(self, handler, method, target, headers):
        """One plain-http request in absolute form; True to keep the client connection open."""
        with self._lock:
            self.forwarded.append(f"{method} {target}")
        parts = urlsplit(target)
        if parts.scheme != "http" or not parts.hostname:
            handler.wfile.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return False
        length = int(next((v for n, v in headers if n.lower() == "content-length"), "0") or 0)
        body = b""
        while len(body) < length:
            chunk = handler.rfile.read(length - len(body))
            if not chunk:
                return False
            body += chunk
        upstream = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=30)
        try:
            path = parts.path + (f"?{parts.query}" if parts.query else "")
            forwarded_headers = {
                name: value
                for name, value in headers
                if name.lower() not in ("proxy-authorization", "proxy-connection", "connection")
            }
            upstream.request(method, path, body=body or None, headers=forwarded_headers)
            response = upstream.getresponse()
            data = response.read()
            handler.wfile.write(f"HTTP/1.1 {response.status} {response.reason}\r\n".encode("latin-1"))
            for name, value in response.getheaders():
                if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                    handler.wfile.write(f"{name}: {value}\r\n".encode("latin-1"))
            handler.wfile.write(f"Content-Length: {len(data)}\r\n\r\n".encode("latin-1"))
            handler.wfile.write(data)
            handler.wfile.flush()
        except OSError:
            handler.wfile.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return False
        finally:
            upstream.close()
        return True
