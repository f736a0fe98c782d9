"""The shared store: whole objects, a miss for what is absent, and a store that is down or slow
switched off after one note, never an error (real stores: a directory, and S3 endpoints that refuse or
never answer; the S3-protocol server itself is tests/e2e/test_shared_cache.py's, in the heavy leg)."""

from __future__ import annotations

import socket
import time

import pytest

from aotcheck.pipeline.store import SharedStore, StoreError, check_url


def test_a_directory_store_writes_whole_objects_and_reads_them_back(tmp_path):
    store = SharedStore(f"file://{tmp_path}/shared")
    assert store.get("ab/abc.json") is None and store.down is None  # Absent: a miss, not a failure.
    store.put("ab/abc.json", b'{"figures": 1}')
    assert store.get("ab/abc.json") == b'{"figures": 1}'
    # Written through a temporary file and a rename: nothing else is left beside the object.
    assert [p.name for p in (tmp_path / "shared" / "ab").iterdir()] == ["abc.json"]


def test_a_read_only_store_writes_nothing(tmp_path):
    SharedStore(f"file://{tmp_path}", write=False).put("ab/abc.json", b"{}")
    assert not (tmp_path / "ab").exists()


@pytest.mark.parametrize("url, says", [
    ("ftp://host/cache", "is not a store aotcheck reads"),
    ("s3://", "is not a store aotcheck reads"),
    ("gs://bucket/cache", "pip install gcsfs"),  # fsspec's GCS package is not in the lock.
    ("/srv/cache", "file:///DIRECTORY"),
])
def test_a_url_aotcheck_cannot_use_names_the_fix(url, says):
    with pytest.raises(StoreError, match=says.replace("(", r"\(")):
        check_url(url)


@pytest.mark.parametrize("url, variables", [
    ("s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/aot", "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
    ("gs://oauth2:ya29.s3cr3t@bucket/aot", "GOOGLE_APPLICATION_CREDENTIALS"),
    ("az://container/aot?sv=2024&sig=s3cr3tsig", "AZURE_STORAGE_CONNECTION_STRING"),
    ("abfs://user:s3cr3t@container/aot", "AZURE_STORAGE_ACCOUNT_KEY"),
    ("ftp://user:s3cr3t@host/aot", None),  # Not a store either: still not repeated.
])
def test_a_url_with_credentials_is_refused_naming_the_variables_and_never_repeated(url, variables):
    with pytest.raises(StoreError) as refused:
        check_url(url)
    said = str(refused.value)
    assert "holds credentials" in said and "***" in said
    assert not any(secret in said for secret in ("wJalrXUtnFEMI", "ya29", "s3cr3t", "AKIAEXAMPLE"))
    assert variables is None or variables in said


def _s3_at(monkeypatch, port: int, timeout: float) -> SharedStore:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return SharedStore("s3://bucket/cache", timeout=timeout)


def test_a_store_that_refuses_is_switched_off_after_one_note(monkeypatch):
    with socket.socket() as s:  # A port nothing listens on.
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = _s3_at(monkeypatch, port, timeout=20)
    start = time.perf_counter()
    assert store.get("ab/abc.json") is None
    store.put("ab/abc.json", b"{}")
    assert store.get("cd/cde.json") is None
    assert store.down is not None and "EndpointConnectionError" in store.down
    (note,) = store.notes  # Once, for every call after the first.
    assert "s3://bucket/cache is unreachable" in note and "compiles what the local cache lacks" in note
    assert time.perf_counter() - start < 15  # Off after the first failure: the later calls cost nothing.


def test_a_store_that_never_answers_is_switched_off_at_the_timeout(monkeypatch):
    with socket.socket() as listener:  # Accepts connections (the kernel's backlog) and never answers.
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        store = _s3_at(monkeypatch, listener.getsockname()[1], timeout=1.5)
        start = time.perf_counter()
        assert store.get("ab/abc.json") is None
        assert store.get("ab/abd.json") is None
        elapsed = time.perf_counter() - start
    assert store.down == "no answer within 1.5 s" and len(store.notes) == 1
    assert elapsed < 5, elapsed  # One timeout, not one per call.


class _Refusing:
    """FAKE: a filesystem that refuses every request for lack of permission, as S3 does with 403 to a
    runner that may not list the bucket (an absent object) or may not write (pure logic of the store)."""

    def cat_file(self, path):
        raise PermissionError("Forbidden")

    def pipe_file(self, path, data):
        raise PermissionError("Access Denied")


def test_a_refused_read_is_a_miss_and_a_refused_write_stops_writes_not_reads():
    store = SharedStore("s3://bucket/cache")
    store._fs = _Refusing()
    assert store.get("ab/abc.json") is None and store.get("cd/cde.json") is None
    assert store.down is None  # Still read: the next object may be readable.
    store.put("ab/abc.json", b"{}")
    assert store.write is False and store.down is None
    assert len(store.notes) == 2, store.notes  # Each said once.
    assert "reading the shared figures cache s3://bucket/cache was refused (PermissionError: Forbidden)" in store.notes[0]
    assert "refuses this runner's writes (PermissionError: Access Denied)" in store.notes[1]


def test_an_unwritable_local_cache_names_the_shared_store_it_turns_off(tmp_path):
    """Hardening round 5, V21: the store behind the local cache went off with it, unnamed. A real session's
    set-up (no case runs): the local cache is a file, so it cannot be a directory."""
    import aotcheck
    from aotcheck.programs.registry import Registry
    from aotcheck.session import GateSession
    from aotcheck.settings import GateSettings

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    registry = Registry()
    registry.register("t", aotcheck.FunctionConfig(fn=lambda x: x, make_args=lambda mesh: ()))
    settings = GateSettings.parse(rootdir=tmp_path, topologies="cpu-1", cache_dir=str(blocker),
                                  cache_url=f"file://{tmp_path}/store")
    session = GateSession(settings, registry=registry, measure=lambda case: None)
    session.prepare()
    assert any(f"aotcheck: the figures cache {blocker} is not writable; running uncached (the shared store file://{tmp_path}/store "
               "behind it is not read or written either)." == w for w in session.warnings), session.warnings


def test_a_read_only_file_system_stops_writes_and_keeps_reads(tmp_path, monkeypatch):
    """Hardening round 5, V22: a read-only file:// store's first failed write turned it off, reads too, said as
    "unreachable". FAKE: the write raises EROFS as a read-only mount's would (root here writes anything)."""
    import errno

    from aotcheck.pipeline import store as module
    from aotcheck.pipeline.store import SharedStore

    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "a.json").write_bytes(b"{}")
    shared = SharedStore(f"file://{tmp_path}/store")

    def read_only(path, data):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(module, "atomic_write_bytes", read_only)
    shared.put("b.json", b"{}")
    assert shared.get("a.json") == b"{}" and shared.down is None and not shared.write
    assert shared.notes == [f"aotcheck: the shared figures cache file://{tmp_path}/store refuses this runner's writes "
                            "(OSError: [Errno 30] Read-only file system); it is read, and nothing more is written to it."], shared.notes
