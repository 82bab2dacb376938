"""``websocat URL`` for the docs' examples where websocat is not installed (no registry this
project installs from has it): prints each text frame as it arrives, one a line, and ends after a
second without one; exit status 1 when none came.

    python -m tests.integration.doc_websocket ws://127.0.0.1:8080/queue/listen/ws/news?sequence=first
"""

from __future__ import annotations

import sys

from websockets.sync.client import connect


def main(argv: list[str]) -> int:
    [url] = argv
    frames = 0
    with connect(url, open_timeout=10) as websocket:
        while True:
            try:
                frame = websocket.recv(timeout=1)
            except TimeoutError:
                break
            print(frame if isinstance(frame, str) else frame.decode(errors="replace"), flush=True)
            frames += 1
    return 0 if frames else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
