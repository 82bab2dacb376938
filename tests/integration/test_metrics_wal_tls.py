"""The metrics listener over TLS (``[metrics.tls]``, ``max_connections``) and the write-ahead
log's figures (``boxqueue_wal_bytes``, ``boxqueue_wal_checkpoints_total``) in fsync mode."""

from __future__ import annotations

import time

import httpx
import pytest
import tarantool
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.security_fixtures import Certs
from tests.serverproc import ServerProcess, free_port


def wal_figures(port: int, certs: Certs) -> tuple[float, float]:
    response = httpx.get(f"https://127.0.0.1:{port}/metrics", verify=certs.client_context(cert=False), timeout=30)
    assert response.status_code == 200, response.text
    found = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            found[sample.name] = sample.value
    return found["boxqueue_wal_bytes"], found["boxqueue_wal_checkpoints_total"]


@pytest.fixture
def served(tmp_path):
    certs = Certs.make(tmp_path / "certs")
    port = free_port()
    server = ServerProcess(
        tmp_path / "server",
        wal_mode="fsync",
        # A checkpoint once the log holds 64 KiB; none by time during the test.
        wal_config="checkpoint_bytes = 65536\ncheckpoint_interval_s = 3600",
        extra_config=f'[metrics]\nlisten = "127.0.0.1:{port}"\nmax_connections = 4\n'
        + certs.tls_section("metrics", client_certs=False),
    )
    server.start()
    try:
        yield server, port, certs
    finally:
        server.stop()


def test_wal_figures_over_tls(served):
    server, port, certs = served
    with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS listener gets no answer
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    size0, checkpoints0 = wal_figures(port, certs)
    conn = tarantool.connect("127.0.0.1", server.port)
    try:
        conn.eval("box.schema.space.create('w'):create_index('pk')")
        conn.replace("w", (1, "x" * 100))
        size1, checkpoints1 = wal_figures(port, certs)
        assert size1 > size0  # the replace's record is in the log
        assert checkpoints1 == checkpoints0
        for i in range(400):  # about 120 KiB of records: past checkpoint_bytes
            conn.replace("w", (i, "y" * 300))
        deadline = time.monotonic() + 30
        while True:
            size2, checkpoints2 = wal_figures(port, certs)
            if checkpoints2 > checkpoints1 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert checkpoints2 > checkpoints1
        assert size2 < 65536 + 4096  # a checkpoint starts the log afresh
        snapshot = httpx.get(f"https://127.0.0.1:{port}/api/snapshot", verify=certs.client_context(cert=False),
                             timeout=30)
        assert snapshot.status_code == 200, snapshot.text
        shown = snapshot.json()["storage"]["plugged"]  # the dashboard's storage card, in words
        assert set(shown) == {"log since checkpoint (bytes)", "checkpoints"}, shown
        assert shown["checkpoints"] >= checkpoints2
    finally:
        conn.close()
