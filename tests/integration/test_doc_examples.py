"""Every fenced example of README.md and docs/*.md, run against a real server (doc_runners.py says
how each kind runs, doc_blocks.py the markers that say otherwise). A block marked ``not run`` is
skipped with its reason; the summary at the end of the run lists what was done with each block.
The last tests check that the harness fails on drift."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tarantool

from tests.integration.doc_blocks import REPORT, ROOT, Example, all_examples, examples_of
from tests.integration.doc_runners import DocumentRun, ExampleFailed, run_example

EXAMPLES = all_examples()


class DocumentRuns:
    """One :class:`DocumentRun` at a time: a document's server stops when the next document starts."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.current: DocumentRun | None = None

    def _new(self, name: str) -> DocumentRun:
        return DocumentRun(name, self.factory.mktemp(re.sub(r"\W+", "-", name)))

    def of(self, document: str) -> DocumentRun:
        if self.current is not None and self.current.document != document:
            self.current.close()
            self.current = None
        if self.current is None:
            self.current = self._new(document)
        return self.current

    def fresh(self, example: Example) -> DocumentRun:
        return self._new(example.name)

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    registry = DocumentRuns(tmp_path_factory)
    yield registry
    registry.close()


@pytest.fixture(scope="module")
def docs_spark():
    """The Spark tests' local session, for the examples marked ``spark``. It is left running:
    test_spark_pipeline.py's and test_spark_streaming.py's ``spark_session()`` get the same one
    (``getOrCreate``), so the suite starts Spark once; it ends with the process."""
    pytest.importorskip("pyspark")
    from tests.integration.spark_fixtures import java_missing, spark_session

    if java_missing():
        pytest.skip("Spark needs Java 17 (java on PATH or JAVA_HOME)")
    return spark_session()


def prepare_spark(run: DocumentRun) -> None:
    """docs/spark.md archives the queue space into ``jobs_archive``, a space of the same format."""
    conn = tarantool.connect("127.0.0.1", run.server().iproto_port)
    try:
        conn.eval("if box.space.jobs_archive == nil then"
                  " box.schema.space.create('jobs_archive', {format = box.space.queue:format()})"
                  ":create_index('task_id', {parts = {{1, 'string'}}}) end")
    finally:
        conn.close()


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"{e.name}-{e.language or 'text'}" for e in EXAMPLES])
def test_example(example: Example, runs: DocumentRuns, request: pytest.FixtureRequest) -> None:
    report = request.config.stash.setdefault(REPORT, [])
    if "not run" in example.words:
        report.append((example.name, "not run", example.reason))
        pytest.skip(f"{example.name}: not run: {example.reason}")
    if "spark" in example.words:
        request.getfixturevalue("docs_spark")
    fresh = "fresh server" in example.words
    run = runs.fresh(example) if fresh else runs.of(example.document)
    try:
        if "spark" in example.words:
            prepare_spark(run)
        done = run_example(example, run)
    finally:
        if fresh:
            run.close()
    report.append((example.name, done + (" on a fresh server" if fresh else ""), example.reason))


def test_every_document_has_examples_found():
    """The extraction sees the blocks (a parser change that found none would pass everything)."""
    by_document: dict[str, int] = {}
    for example in EXAMPLES:
        by_document[example.document] = by_document.get(example.document, 0) + 1
    fences = {
        path.relative_to(ROOT).as_posix(): sum(1 for line in path.read_text().splitlines()
                                               if re.match(r"^\s*```\S*\s*$", line)) // 2
        for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    }
    assert {d: n for d, n in fences.items() if n} == by_document


# -- the harness fails on drift ------------------------------------------------------------------

DRIFTED = {
    "a moved module": ("```python\nfrom facades.deckard.generated import deckard_service_pb2\n```\n",
                       "ModuleNotFoundError"),
    "a wrong result": ('```python\nimport tarantool\nc = tarantool.connect("127.0.0.1", 33020)\n'
                       'c.call("box.queue.put", [0, "drift", 0, 0, 0, 0, "x"])  # [[id, "drift", "taken", "x"]]\n```\n',
                       "the comment says"),
    "an error that is not raised": ('```python\nimport tarantool\nc = tarantool.connect("127.0.0.1", 33020)\n'
                                    'c.call("box.session.user")  # ER_PROC_LUA "nope"\n```\n', "but it answered"),
    "a wrong error": ('```python\nimport tarantool\nc = tarantool.connect("127.0.0.1", 33020)\n'
                      'c.call("no.such.function")  # ER_PROC_LUA "nope"\n```\n', "but it failed with 33"),
    "an HTTP error": ("```sh\ncurl -X POST localhost:8080/queue/no-such-verb/news\n```\n", "answered 404"),
    "a wrong body": ("```sh\ncurl -X POST localhost:8080/queue/create/drift   # 201 {\"success\":false}\n```\n",
                     "the comment says"),
    "a refused connection": ("```sh\ncurl localhost:1/\n```\n", "exited 7"),
    "a bad configuration": ('```toml\n[iproto]\nlisen = "127.0.0.1:3301"\n```\n', "lisen"),
    "a failing Lua chunk": ("```lua\nbox.space.no_such_space:len()\n```\n", "the chunk failed"),
    "a wrong console answer": ("<!-- example: console -->\n```\n$ tarantoolctl connect 127.0.0.1:33022\n"
                               "127.0.0.1:33022> 1 + 1\n---\n- 3\n...\n```\n", "the console answered"),
    "a console error": ("<!-- example: console -->\n```\n$ tarantoolctl connect 127.0.0.1:33022\n"
                        "127.0.0.1:33022> box.space.nope:len()\n```\n", "failed"),
    "an option that is gone": ("<!-- example: options only: a benchmark -->\n```sh\n"
                               ".venv/bin/python bench/iproto_load.py --no-such-option 3\n```\n", "takes no --no-such-option"),
    "a module that is gone": ("<!-- example: options only: a job -->\n```sh\n"
                              ".venv/bin/python -m pipeline.examples.load_tube --tube x\n```\n", "exited 1"),
    "a zip without the package": ("<!-- example: options only: a cluster -->\n```sh\nzip -r p.zip boxqueue/pipeline\n"
                                  "spark-submit --py-files p.zip boxqueue/pipeline/examples/export_space.py --space q\n```\n",
                                  "does not hold what the script imports"),
    "a synopsis option that is gone": ("<!-- example: synopsis -->\n```\nboxqueue serve --config FILE [--no-such DIR]\n```\n",
                                       "takes no --no-such"),
    "a Prometheus target that is wrong": ('```yaml\nscrape_configs:\n  - job_name: x\n    static_configs:\n'
                                          '      - targets: ["127.0.0.1:9100"]\n    metrics_path: /nothing\n```\n',
                                          "answered 404"),
    "a block nobody runs": ("```ini\n[x]\n```\n", "no runner"),
}


@pytest.fixture(scope="module")
def drift_run(tmp_path_factory):
    run = DocumentRun("drift.md", tmp_path_factory.mktemp("drift"))
    yield run
    run.close()


@pytest.mark.parametrize("case", sorted(DRIFTED))
def test_a_drifted_example_fails(case: str, drift_run: DocumentRun) -> None:
    markdown, expected = DRIFTED[case]
    [example] = examples_of(Path("drift.md"), markdown)
    with pytest.raises(ExampleFailed) as failed:
        run_example(example, drift_run)
    assert expected in str(failed.value)

