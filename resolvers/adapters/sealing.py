"""Web Push payload encryption (RFC 8291, aes128gcm, by http_ece), in a process of its own.

:class:`resolvers.adapters.webpush.SealingProcess` runs this file as a script in a child
Python (``python -I sealing.py``) and talks to it in JSON lines: one request on stdin per
slice of pushes, ``[[payload, p256dh, auth], ...]`` (the payload in base64, the keys in
base64url as the browser gave them), answered on stdout by one line with each push's body
in base64, or ``{"error": ...}`` for a push that could not be encrypted.

A push's encryption is a new ECDH key pair, an ECDH with the browser's key and two HKDFs
before the AES-GCM: about twice the CPU of the POST that carries it. In the server's process
it shared the event loop's core and its GIL; here it runs on the machine's other core. The
child keeps nothing between requests, and exits when its stdin closes: when the server closes
it, and when the server dies (a SIGKILL included), since nothing else holds that pipe.

This module imports nothing from the project (the child runs it as a plain script).
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

import http_ece
from cryptography.hazmat.primitives.asymmetric import ec


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def seal(payload: bytes, p256dh: bytes, auth: bytes) -> bytes:
    """The body of one push: RFC 8188's header (salt, record size, our public key) and
    the one encrypted record, with a key pair made for this push alone."""
    key = ec.generate_private_key(ec.SECP256R1())
    body: bytes = http_ece.encrypt(payload, private_key=key, dh=p256dh, auth_secret=auth, version="aes128gcm")
    return body


def answer(request: bytes) -> bytes:
    answers: list[Any] = []
    for payload, p256dh, auth in json.loads(request):
        try:
            body = seal(base64.b64decode(payload), unb64url(p256dh), unb64url(auth))
        except Exception as error:  # that push's own: the others are sealed
            answers.append({"error": f"{type(error).__name__}: {error}"})
        else:
            answers.append(base64.b64encode(body).decode())
    return json.dumps(answers).encode() + b"\n"


def main() -> int:
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        try:
            out.write(answer(line))
            out.flush()
        except BrokenPipeError:
            return 0  # the server is gone
    return 0


if __name__ == "__main__":
    sys.exit(main())
