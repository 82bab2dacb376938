"""The wheel: built from the repository's files, installed into a fresh virtualenv, it answers
``boxqueue --version``, writes a starter configuration with ``boxqueue init`` and serves from any
directory, every facade on, from its installed files alone (compiled modules, Lua, Deckard's
generated code, the dashboard).

The wheel is built with the test environment's build tools (``--no-build-isolation``: Cython,
setuptools and grpcio-tools are there already); the fresh virtualenv installs the wheel's
dependencies from the package index (pip's cache makes that quick after ``make install``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import grpc
import httpx
import pytest
import tarantool

from tests.serverproc import free_port, wait_for_greeting

ROOT = Path(__file__).resolve().parents[2]


def _repository_files(into: Path) -> None:
    """The files git tracks, and the new ones it does not ignore, as a clean checkout has them
    (nothing built: no compiled modules, no generated code)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the work tree
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtualenv with the wheel installed; its bin folder."""
    work = tmp_path_factory.mktemp("wheel")
    source, wheels = work / "source", work / "wheels"
    _repository_files(source)
    subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels)], cwd=source, check=True, timeout=1800)
    [wheel] = wheels.glob("boxqueue-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith(".c")], "Cython's C sources are not shipped"
    assert "boxqueue/facades/deckard/generated/deckard_service_pb2_grpc.py" in names
    assert "boxqueue/boxqueue.toml" in names and "boxqueue/lua_box/box.lua" in names
    assert any(n.startswith("boxqueue/iproto/dispatch.") and n.endswith(".so") for n in names)
    assert "boxqueue/metrics/dashboard/index.html" in names
    # One import name in site-packages: every room is a subpackage of boxqueue.
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"boxqueue"}
    print(f"wheel: {wheel.name}, {wheel.stat().st_size / 1e6:.1f} MB")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=1800)
    return venv / "bin"


def test_the_installed_wheel_serves_from_any_directory(installed, tmp_path):
    version = subprocess.run([installed / "boxqueue", "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == "boxqueue 0.1.0"
    site = tmp_path / "site"
    made = subprocess.run([installed / "boxqueue", "init", str(site)], capture_output=True, text=True, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    config = site / "boxqueue.toml"
    again = subprocess.run([installed / "boxqueue", "init", str(site)], capture_output=True, text=True)
    assert again.returncode == 2 and "exists already" in again.stderr
    # the starter's listeners moved to free ports (other tests run servers of their own)
    text = re.sub(r'"127\.0\.0\.1:\d+"', lambda _m: f'"127.0.0.1:{free_port()}"', config.read_text())
    config.write_text(text)
    checked = subprocess.run([installed / "boxqueue", "check-config", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # Nothing of the repository on the path: the installed package only.
    env = {"PATH": f"{installed}:/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.Popen([installed / "boxqueue", "serve", "--config", str(config)], cwd=elsewhere, env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        iproto_port = int(re.search(r'\[iproto\]\nlisten = "127\.0\.0\.1:(\d+)"', text).group(1))
        wait_for_greeting(iproto_port, 60, proc)
        conn = tarantool.connect("127.0.0.1", iproto_port)
        assert conn.call("box.queue.put", [0, "wheel", 0, 0, 0, 0, "from the wheel"]).data[0][3] == "from the wheel"
        assert conn.call("box.queue.take", [0, "wheel", 1]).data[0][3] == "from the wheel"
        assert conn.eval("return require('queue')._VERSION").data == ["1.5.0"]
        conn.close()
        assert (site / "data").is_dir()  # the data directory beside the configuration
        # Deckard (its generated code came with the wheel), Zaqar, Sonya and the dashboard answer
        deckard = int(re.search(r'\[deckard\][^\[]*?listen = "127\.0\.0\.1:(\d+)"', text, flags=re.S).group(1))
        with grpc.insecure_channel(f"127.0.0.1:{deckard}") as channel:
            from grpc_health.v1 import health_pb2, health_pb2_grpc

            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status
            assert status == health_pb2.HealthCheckResponse.SERVING
        metrics = int(re.search(r'\[metrics\][^\[]*?listen = "127\.0\.0\.1:(\d+)"', text, flags=re.S).group(1))
        page = httpx.get(f"http://127.0.0.1:{metrics}/", timeout=10)
        assert page.status_code == 200 and "<html" in page.text.lower()
        zaqar = int(re.search(r'\[zaqar\][^\[]*?listen = "127\.0\.0\.1:(\d+)"', text, flags=re.S).group(1))
        headers = {"Client-ID": "3381af92-2b9e-11e3-b191-71861300734c", "X-Project-Id": "wheel"}
        assert httpx.put(f"http://127.0.0.1:{zaqar}/v1.1/queues/w", headers=headers, timeout=10).status_code == 201
    finally:
        proc.terminate()
        try:
            _out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _out, err = proc.communicate()
    assert proc.returncode == 0, err[-2000:]
