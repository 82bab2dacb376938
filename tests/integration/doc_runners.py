"""How each kind of fenced example of the README and docs/ runs, against a real server.

The server is ``conf/boxqueue.toml`` as shipped (``make run`` serves it, and the README's first
sessions name its ports), started on free loopback ports with a data directory of its own; the
ports the examples write are rewritten to those. A document's blocks share one server and, for
Python, one namespace, as a reader typing them in order would. Every failure is an
:class:`ExampleFailed` naming the document's line.
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import tokenize
import tomllib
from pathlib import Path
from typing import Any

import httpx
import tarantool
import yaml
from prometheus_client.parser import text_string_to_metric_families

from boxqueue.config import ConfigError, load_config
from tests.integration.doc_blocks import ROOT, Example
from tests.integration.doc_claims import ClaimFailed, claim_of
from tests.integration.test_console import Console
from tests.serverproc import ServerProcess, free_port

SHIPPED = ROOT / "conf" / "boxqueue.toml"
VENV_BIN = Path(sys.executable).parent
COMMAND_TIMEOUT_S = 60


class ExampleFailed(AssertionError):
    pass


class ShippedServer:
    """``conf/boxqueue.toml`` served on free loopback ports (``ports``: shipped -> free)."""

    def __init__(self, workdir: Path) -> None:
        shipped = load_config(SHIPPED)  # the real loader: the listeners the file declares
        text = SHIPPED.read_text()
        self.ports: dict[int, int] = {}

        def move(found: re.Match[str]) -> str:
            port = self.ports.setdefault(int(found.group(1)), free_port())
            return f'"127.0.0.1:{port}"'

        text = re.sub(r'"127\.0\.0\.1:(\d+)"', move, text)
        if 'data_dir = "../data"' not in text:
            raise ExampleFailed(f"{SHIPPED} no longer holds data_dir = \"../data\"")
        text = text.replace('data_dir = "../data"', 'data_dir = "data"')
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "boxqueue.toml").write_text(text)
        assert shipped.iproto.listen is not None and shipped.iproto.admin_listen is not None
        self.proc = ServerProcess(workdir, port=self.ports[shipped.iproto.listen.port],
                                  admin_port=self.ports[shipped.iproto.admin_listen.port])
        self.proc.start(timeout=60)
        for port in self.ports.values():  # the HTTP listeners start after iproto's
            _wait_for_listener(port, self.proc)

    def substitute(self, text: str) -> str:
        """The example with the shipped ports replaced by this server's."""
        if not self.ports:
            return text
        pattern = r"\b(" + "|".join(str(p) for p in self.ports) + r")\b"
        return re.sub(pattern, lambda m: str(self.ports[int(m.group(1))]), text)

    @property
    def iproto_port(self) -> int:
        return self.proc.port

    def stop(self) -> None:
        self.proc.stop()


def _wait_for_listener(port: int, proc: ServerProcess, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise ExampleFailed(f"nothing listens on {port}\n--- server log ---\n{proc.log()}")


class DocumentRun:
    """What a document's blocks share: its server (started at the first block that needs it), the
    Python namespace, a folder for files."""

    def __init__(self, document: str, workdir: Path) -> None:
        self.document = document
        self.workdir = workdir
        self.namespace: dict[str, Any] = {"__name__": "__example__"}
        self._server: ShippedServer | None = None

    def server(self) -> ShippedServer:
        if self._server is None:
            self._server = ShippedServer(self.workdir / "server")
        return self._server

    def close(self) -> None:
        for value in self.namespace.values():
            if isinstance(value, tarantool.Connection):
                value.close()
        self.namespace.clear()
        if self._server is not None:
            self._server.stop()
            self._server = None


def run_example(example: Example, run: DocumentRun) -> str:
    """Run one block (its marker and language say how); what was done, in a few words."""
    words = example.words
    if "options only" in words:
        check_options(example, run.workdir)
        return "options checked"
    if "synopsis" in words:
        check_synopsis(example)
        return "synopsis checked"
    if "console" in words:
        run_console(example, run.server())
        return "console transcript"
    language = example.language
    if language == "python":
        run_python(example, run.server().substitute(example.text), run.namespace)
    elif language in ("sh", "bash", "shell"):
        run_shell(example, run.server().substitute(example.text), run.workdir)
    elif language == "toml":
        load_toml(example, run.workdir)
    elif language == "yaml" and "scrape_configs:" in example.text:
        scrape(example, run.server().substitute(example.text))
    elif language == "lua":
        run_lua(example, run.server())
    else:
        raise ExampleFailed(
            f"{example.name}: no runner for a block of language {language!r}; mark it, e.g. "
            "<!-- example: not run: why -->, or teach tests/integration/doc_runners.py to run it"
        )
    return f"{language} run"


# -- Python --------------------------------------------------------------------------------------


def _comments(source: str) -> dict[int, str]:
    out = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            out[token.start[0]] = token.string
    return out


def run_python(example: Example, source: str, namespace: dict[str, Any]) -> None:
    """Each top-level statement in turn; a claim in a statement's comment is checked against its
    value (a connector's answer by its ``data``) or the error it raised."""
    comments = _comments(source)
    for statement in ast.parse(source).body:
        where = f"{example.document}:{example.line + statement.lineno}"
        shown = ast.get_source_segment(source, statement)
        claims = [c for n in range(statement.lineno, statement.end_lineno + 1)
                  if (c := claim_of(comments.get(n, "#"))) is not None]
        if claims and not isinstance(statement, ast.Expr):
            raise ExampleFailed(f"{where}: a claimed result on a statement that is not an expression: {shown}")
        try:
            if isinstance(statement, ast.Expr):
                value = eval(compile(ast.Expression(statement.value), where, "eval"), namespace)
            else:
                exec(compile(ast.Module([statement], []), where, "exec"), namespace)
                value = None
        except Exception as exc:
            if claims and isinstance(exc, tarantool.error.DatabaseError):
                try:
                    claims[0].check_error(exc.args[0], str(exc.args[1]))
                except ClaimFailed as failed:
                    raise ExampleFailed(f"{where}: {shown}\n{failed}") from None
                continue
            raise ExampleFailed(f"{where}: {shown}\nraised {type(exc).__name__}: {exc}") from exc
        if claims:
            try:
                claims[0].check_value(getattr(value, "data", value))
            except ClaimFailed as failed:
                raise ExampleFailed(f"{where}: {shown}\n{failed}") from None


# -- shell ---------------------------------------------------------------------------------------


def _split_comment(line: str) -> tuple[str, str]:
    """The code and the comment of one shell line (a '#' outside quotes, after a blank)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip(), line[i:]
    return line, ""


def shell_commands(text: str) -> list[tuple[int, str, str]]:
    """The logical commands of a block: (line within the block, code, the last line's comment)."""
    out: list[tuple[int, str, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        first = i
        code, comment = _split_comment(lines[i])
        parts = [code]
        while code.endswith("\\") and i + 1 < len(lines):
            i += 1
            code, comment = _split_comment(lines[i])
            parts.append(code)
        i += 1
        joined = "\n".join(parts).strip()
        if joined:
            out.append((first + 1, joined, comment))
    return out


_SHELL_PRELUDE = r"""
curl() {
    command curl --silent --show-error --max-time 30 --output "$BQ_DIR/body" \
        --write-out '%{http_code}' "$@" > "$BQ_DIR/status.$BQ_N" || return $?
    cat "$BQ_DIR/body"
}
"""
# websocat is in no registry this project installs from: the examples' websocat becomes a small
# client of the websockets library that prints the frames as websocat does.
_WEBSOCAT = 'websocat() { "$BQ_PYTHON" -m tests.integration.doc_websocket "$@"; }\n'


def run_shell(example: Example, text: str, workdir: Path) -> None:
    """The block in one bash, command by command; each must exit 0, each curl get a status below
    400, and a claim in a command's comment (``# 201 {"success":true}``) must hold."""
    commands = shell_commands(text)
    out = workdir / f"sh-{example.line}"
    out.mkdir(parents=True, exist_ok=True)
    script = [_SHELL_PRELUDE, _WEBSOCAT if shutil.which("websocat") is None else ""]
    for n, (_line, code, _comment) in enumerate(commands):
        script.append(f'BQ_N={n}\n{{ {code}\n}} > "$BQ_DIR/out.{n}" 2> "$BQ_DIR/err.{n}"\n'
                      f'echo $? > "$BQ_DIR/rc.{n}"\n[ "$(cat "$BQ_DIR/rc.{n}")" = 0 ] || exit 0\n')
    env = dict(os.environ, BQ_DIR=str(out), BQ_PYTHON=sys.executable, PYTHONPATH=str(ROOT),
               PATH=f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    subprocess.run(["bash", "-c", "".join(script)], cwd=workdir, env=env, timeout=COMMAND_TIMEOUT_S * 2,
                   check=True)
    for n, (line, code, comment) in enumerate(commands):
        where = f"{example.document}:{example.line + line}"
        rc_file = out / f"rc.{n}"
        if not rc_file.exists():
            raise ExampleFailed(f"{where}: not reached")
        stdout, stderr = (out / f"out.{n}").read_text(), (out / f"err.{n}").read_text()
        if rc_file.read_text().strip() != "0":
            raise ExampleFailed(f"{where}: {code}\nexited {rc_file.read_text().strip()}: {stderr}{stdout}")
        claim = claim_of(comment) if comment else None
        status_file = out / f"status.{n}"
        status = int(status_file.read_text()) if status_file.exists() else None
        if status is not None and (claim is None or claim.status is None) and status >= 400:
            raise ExampleFailed(f"{where}: {code}\nanswered {status}: {stdout}")
        if claim is None:
            continue
        if claim.status is not None and claim.status != status:
            raise ExampleFailed(f"{where}: {code}\nthe comment says {claim.text!r}, but it answered {status}: {stdout}")
        if claim.value is not None:
            try:
                body = json.loads(stdout)
            except ValueError:
                raise ExampleFailed(f"{where}: {code}\nthe comment says {claim.text!r}, but it answered {stdout!r}") from None
            try:
                claim.check_value(body)
            except ClaimFailed as failed:
                raise ExampleFailed(f"{where}: {code}\n{failed}") from None


# -- configuration and Prometheus -----------------------------------------------------------------


def _tables_of(text: str) -> set[str]:
    return {m.group(1).strip() for m in re.finditer(r"^\[+([^\]]+)\]+\s*(?:#.*)?$", text, re.M)}


def load_toml(example: Example, workdir: Path) -> None:
    """The block as a configuration file, read by the server's own loader. With ``in FILE``, the
    block's tables replace that file's tables of the same names first."""
    text = example.text
    within = example.within
    if within is not None:
        replaced = _tables_of(example.text)
        kept, dropping = [], False
        for line in within.read_text().splitlines():
            header = re.match(r"^\[+([^\]]+)\]+\s*(?:#.*)?$", line)
            if header is not None:
                dropping = header.group(1).strip() in replaced
            if not dropping:
                kept.append(line)
        text = "\n".join(kept) + "\n" + example.text
    path = workdir / f"example-{example.line}.toml"
    path.write_text(text)
    try:
        tomllib.loads(text)
        load_config(path)
    except (ConfigError, tomllib.TOMLDecodeError) as exc:
        raise ExampleFailed(f"{example.name}: the configuration does not load: {exc}") from None


def scrape(example: Example, text: str) -> None:
    """A Prometheus scrape config: every static target scraped as Prometheus would."""
    config = yaml.safe_load(text)
    jobs = config.get("scrape_configs") or []
    if not jobs:
        raise ExampleFailed(f"{example.name}: no scrape_configs")
    for job in jobs:
        targets = [t for group in job.get("static_configs", []) for t in group.get("targets", [])]
        if not targets:
            raise ExampleFailed(f"{example.name}: job {job.get('job_name')!r} has no targets")
        auth = job.get("basic_auth")
        for target in targets:
            url = f"{job.get('scheme', 'http')}://{target}{job.get('metrics_path', '/metrics')}"
            answer = httpx.get(url, timeout=30, auth=(auth["username"], auth["password"]) if auth else None)
            if answer.status_code != 200:
                raise ExampleFailed(f"{example.name}: {url} answered {answer.status_code}")
            names = {family.name for family in text_string_to_metric_families(answer.text)}
            if not any(name.startswith("boxqueue_") for name in names):
                raise ExampleFailed(f"{example.name}: {url} has no boxqueue_ series: {sorted(names)[:10]}")


# -- Lua and the console -------------------------------------------------------------------------


def run_lua(example: Example, server: ShippedServer) -> None:
    """A Lua chunk, sent as EVAL."""
    conn = tarantool.connect("127.0.0.1", server.iproto_port)
    try:
        conn.eval(server.substitute(example.text))
    except tarantool.error.DatabaseError as exc:
        raise ExampleFailed(f"{example.name}: the chunk failed: {exc}") from None
    finally:
        conn.close()


_PROMPT = re.compile(r"^(\S+:\d+)> (.*)$")


def run_console(example: Example, server: ShippedServer) -> None:
    """A console transcript: ``$ tarantoolctl connect HOST:PORT``, then statements after prompts,
    each followed by its answer (checked as shown) or by nothing (any answer but an error)."""
    lines = server.substitute(example.text).splitlines()
    connect = re.match(r"^\$ tarantoolctl connect (\S+):(\d+)$", lines[0]) if lines else None
    if connect is None:
        raise ExampleFailed(f"{example.name}: a console transcript starts with `$ tarantoolctl connect HOST:PORT`")
    console = Console(int(connect.group(2)))
    try:
        steps: list[tuple[int, str, list[str]]] = []
        for n, line in enumerate(lines[1:], start=2):
            prompt = _PROMPT.match(line)
            if prompt is not None:
                if prompt.group(1) != f"{connect.group(1)}:{connect.group(2)}":
                    raise ExampleFailed(f"{example.document}:{example.line + n}: the prompt names another address")
                steps.append((n, prompt.group(2), []))
            elif steps:
                steps[-1][2].append(line)
            elif line.strip():
                raise ExampleFailed(f"{example.document}:{example.line + n}: output before any statement")
        for n, statement, expected in steps:
            answer = console.run(statement)
            shown = "\n".join(expected).strip()
            if shown and answer.strip() != shown:
                raise ExampleFailed(f"{example.document}:{example.line + n}: {statement}\n"
                                    f"the transcript shows\n{shown}\nthe console answered\n{answer}")
            if not shown and "- error:" in answer:
                raise ExampleFailed(f"{example.document}:{example.line + n}: {statement}\nfailed: {answer}")
    finally:
        console.close()


# -- commands checked, not run -------------------------------------------------------------------


def _options(args: list[str]) -> list[str]:
    return [m.group(0) for a in args if (m := re.match(r"--[A-Za-z][\w-]*", a.strip("[]")))]


def _help_has(where: str, command: list[str], options: list[str]) -> None:
    proc = subprocess.run([*command, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if proc.returncode != 0:
        raise ExampleFailed(f"{where}: {' '.join(command)} --help exited {proc.returncode}: {proc.stderr[-1500:]}")
    missing = [o for o in options if not re.search(re.escape(o) + r"(?![\w-])", proc.stdout)]
    if missing:
        raise ExampleFailed(f"{where}: {' '.join(command)} takes no {', '.join(missing)}")


def _program(name: str) -> str:
    """A program the docs name: a path in the repository, or a command of the venv or PATH."""
    if "/" in name:
        path = ROOT / name
        if not path.exists():
            raise ExampleFailed(f"{name} does not exist")
        return str(path)
    found = shutil.which(name, path=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    if found is None:
        raise ExampleFailed(f"{name} is not installed")
    return found


def _boxqueue_imports(script: Path) -> list[str]:
    names = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("boxqueue"):
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("boxqueue"))
    return sorted(names)


def check_options(example: Example, workdir: Path) -> None:
    """Commands not run (the marker says why): each program exists, each Python module or script
    takes the options written (its ``--help``), a ``zip`` is made as written, and a script shipped
    with ``--py-files`` imports its boxqueue modules from that zip alone."""
    zips: dict[str, Path] = {}
    for line, code, _comment in shell_commands(example.text):
        where = f"{example.document}:{example.line + line}"
        argv = shlex.split(code.replace("\\\n", " "))
        program = Path(argv[0]).name
        try:
            if re.fullmatch(r"python[\d.]*", program):
                _program(argv[0])
                if argv[1] == "-m":
                    _help_has(where, [sys.executable, "-m", argv[2]], _options(argv[3:]))
                else:
                    _program(argv[1])
                    _help_has(where, [sys.executable, argv[1]], _options(argv[2:]))
            elif program == "spark-submit":
                _program(argv[0])
                rest = argv[1:]
                shipped = None
                while rest and rest[0].startswith("--"):
                    if rest[0] == "--py-files":
                        shipped = rest[1]
                    rest = rest[2:]
                script = Path(_program(rest[0]))
                _help_has(where, [sys.executable, str(script)], _options(rest[1:]))
                if shipped is not None:
                    if shipped not in zips:
                        raise ExampleFailed(f"{where}: --py-files {shipped} is made by no command above")
                    _imports_from_zip(where, zips[shipped], _boxqueue_imports(script))
            elif program == "zip":
                flags = [a for a in argv[1:] if a.startswith("-")]
                output, *paths = [a for a in argv[1:] if not a.startswith("-")]
                missing = [p for p in paths if not (ROOT / p).exists()]
                if missing:
                    raise ExampleFailed(f"{where}: {code}\nno {', '.join(missing)} in the repository")
                zips[output] = workdir / f"zip-{example.line}" / output
                zips[output].parent.mkdir(parents=True, exist_ok=True)
                zips[output].unlink(missing_ok=True)
                subprocess.run(["zip", "-q", *flags, str(zips[output]), *paths], cwd=ROOT, check=True,
                               timeout=COMMAND_TIMEOUT_S)
            else:
                raise ExampleFailed(f"{where}: options only: no way to check {argv[0]} here")
        except ExampleFailed as exc:
            raise ExampleFailed(str(exc) if str(exc).startswith(where) else f"{where}: {exc}") from None


def _imports_from_zip(where: str, archive: Path, modules: list[str]) -> None:
    """Each module imported from the archive alone, as an executor given only the zip would."""
    probe = (
        "import importlib, sys\n"
        f"sys.path.insert(0, {str(archive)!r})\n"
        f"for name in {modules!r}:\n"
        "    module = importlib.import_module(name)\n"
        f"    assert module.__file__.startswith({str(archive)!r}), (name, module.__file__)\n"
    )
    proc = subprocess.run([sys.executable, "-I", "-c", probe], cwd=archive.parent, capture_output=True,
                          text=True, timeout=COMMAND_TIMEOUT_S)
    if proc.returncode != 0:
        raise ExampleFailed(f"{where}: {archive.name} does not hold what the script imports: {proc.stderr[-1500:]}")


def check_synopsis(example: Example) -> None:
    """Command lines with placeholders: the program and subcommand exist and take the options
    written (``--help``); a line without placeholders is run and must succeed."""
    for line, code, _comment in shell_commands(example.text):
        where = f"{example.document}:{example.line + line}"
        argv = shlex.split(code)
        program = _program(argv[0])
        placeholders = [a for a in argv[1:] if "[" in a or "]" in a or re.fullmatch(r"[A-Z][A-Z_]*", a)]
        if not placeholders:
            proc = subprocess.run([program, *argv[1:]], cwd=ROOT, capture_output=True, text=True,
                                  timeout=COMMAND_TIMEOUT_S)
            if proc.returncode != 0 or not proc.stdout.strip():
                raise ExampleFailed(f"{where}: {code}\nexited {proc.returncode}: {proc.stderr[-1500:]}")
            continue
        command = [program]
        if len(argv) > 1 and re.fullmatch(r"[a-z][\w-]*", argv[1]):
            command.append(argv[1])
        _help_has(where, command, _options(argv[1:]))
