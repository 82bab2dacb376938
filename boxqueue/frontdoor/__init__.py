"""The front door: the HTTP/1.1, HTTP/2 and gRPC connections the facades are served over.

Transport only (framing, flow control, deadlines, limits, TLS): what a request means is the
facades' (``boxqueue.facades``), which this room never imports.
"""
