"""A private Python package index for tests: HTTPS with a CA of its own (which only the test's
"host configuration" trusts), HTTP Basic credentials, one wheel, served from a network namespace
of its own joined to the host's by a veth pair (so that a networked sandbox, which may reach no
address of the host, reaches it as it would a machine outside).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import io
import ipaddress
import os
import shutil
import subprocess
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

NET = ("198.18.214.1", "198.18.214.2")  # RFC 2544 benchmarking range: never routed anywhere
PACKAGE, VERSION, MARK = "idegym-probe", "1.0", "from-the-private-index"
WHEEL = f"idegym_probe-{VERSION}-py3-none-any.whl"

SERVER = r'''
import base64, http.server, ssl, sys
address, cert, key, wheel_path, user, password = sys.argv[1:7]
wheel = open(wheel_path, "rb").read()
name = wheel_path.rsplit("/", 1)[-1]
expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
import hashlib
digest = hashlib.sha256(wheel).hexdigest()

class Index(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.headers.get("Authorization") != expected:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="private"')
            self.end_headers()
            return
        if self.path.rstrip("/") == "/simple":
            body = b'<a href="idegym-probe/">idegym-probe</a>'
        elif self.path.rstrip("/") == "/simple/idegym-probe":
            body = f'<a href="/files/{name}#sha256={digest}">{name}</a>'.encode()
        elif self.path == f"/files/{name}":
            body = wheel
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        kind = "application/octet-stream" if self.path.startswith("/files/") else "text/html"
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

server = http.server.ThreadingHTTPServer((address, 0), Index)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
'''


@dataclass(frozen=True)
class PrivateIndex:
    host: str
    port: int
    user: str
    password: str
    ca: Path  # the index's CA certificate (PEM): trusted by nothing on this machine

    @property
    def url(self) -> str:
        return f"https://{self.user}:{self.password}@{self.host}:{self.port}/simple/"


def _certificates(directory: Path, address: str) -> tuple[Path, Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "idegym test index CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, address)])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def _wheel(directory: Path) -> Path:
    dist = f"idegym_probe-{VERSION}.dist-info"
    files = {"idegym_probe/__init__.py": f"MARK = {MARK!r}\n".encode(),
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {VERSION}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: idegym-tests\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n"}
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for name, data in files.items()) + f"{dist}/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in {**files, f"{dist}/RECORD": record.encode()}.items():
            archive.writestr(name, data)
    path = directory / WHEEL
    path.write_bytes(buffer.getvalue())
    return path


@pytest.fixture
def private_index(tmp_path: Path) -> Iterator[PrivateIndex]:
    if not (shutil.which("ip") and os.geteuid() == 0):
        pytest.fail("needs root and iproute2 (a network namespace for the index)")
    work = tmp_path / "index"
    work.mkdir()
    ca, cert, key = _certificates(work, NET[1])
    wheel = _wheel(work)
    name = f"idgi{os.getpid() % 100000}"
    host_end, far_end = f"{name}h", f"{name}o"
    steps = [["ip", "netns", "add", name], ["ip", "link", "add", host_end, "type", "veth", "peer", "name", far_end],
             ["ip", "link", "set", far_end, "netns", name],
             ["ip", "addr", "add", f"{NET[0]}/30", "dev", host_end], ["ip", "link", "set", host_end, "up"],
             ["ip", "netns", "exec", name, "ip", "addr", "add", f"{NET[1]}/30", "dev", far_end],
             ["ip", "netns", "exec", name, "ip", "link", "set", far_end, "up"]]
    server = None
    password = base64.b32encode(os.urandom(10)).decode().lower()
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        (work / "server.py").write_text(SERVER)
        server = subprocess.Popen(["ip", "netns", "exec", name, "python3", str(work / "server.py"), NET[1], str(cert),
                                   str(key), str(wheel), "tester", password], stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None
        yield PrivateIndex(NET[1], int(server.stdout.readline()), "tester", password, ca)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "netns", "del", name], capture_output=True)  # takes the veth pair along
        subprocess.run(["ip", "link", "del", host_end], capture_output=True)
