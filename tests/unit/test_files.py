"""aotcheck._files: a file is written whole or not at all (a reader sees the old text or the new,
never half), through a symbolic link, with the user's umask; an unwritable place says so."""

import os
import threading

import pytest

from aotcheck._files import atomic_write_text, probe_writable


def test_a_reader_sees_the_old_text_or_the_new_never_part(tmp_path):
    path = tmp_path / "golden.json"
    texts = ["a" * 200_000, "b" * 300_000]
    atomic_write_text(path, texts[0])
    seen, done = set(), threading.Event()

    def read():
        while not done.is_set():
            seen.add(path.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(40):
        atomic_write_text(path, texts[i % 2])
    done.set()
    reader.join()
    assert seen <= set(texts) and len(seen) == 2  # Both versions seen; nothing in between.
    assert [p.name for p in tmp_path.iterdir()] == ["golden.json"]  # No temporary file left.


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "golden.json"
    atomic_write_text(path, "old")

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)  # The disk fills as the new text is flushed.
    with pytest.raises(OSError, match="No space left"):
        atomic_write_text(path, "new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["golden.json"]


def test_a_link_is_written_through_and_stays_a_link(tmp_path):
    target = tmp_path / "kept" / "golden.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "golden.json"
    link.symlink_to(target)
    atomic_write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"


def test_the_users_umask_not_the_temporary_files(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o640


def test_an_unwritable_place_raises(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(OSError):
        probe_writable(blocker / "cache")
    probe_writable(tmp_path / "new" / "cache")
    assert (tmp_path / "new" / "cache").is_dir() and not list((tmp_path / "new" / "cache").iterdir())
