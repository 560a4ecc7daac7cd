"""``store.FileIO``, the public file at a URL: one behaviour on a local disk (as a path and as
a ``file://`` URL) and on S3 (the moto server)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from store import ConfigurationError, FileIO
from store.urls import plain_path


@pytest.fixture(params=["path", "file-url", pytest.param("s3", marks=pytest.mark.s3)])
def root_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "path":
        return str(tmp_path / "root")
    if request.param == "file-url":
        return f"file://{tmp_path}/root"
    bucket: str = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/root"


def test_write_read_list_walk_and_delete(root_url: str) -> None:
    io = FileIO(root_url)
    assert io.local == (not root_url.startswith("s3://"))
    assert io.names(io.root) == []
    assert io.walk(io.root) == {}
    assert not io.exists(io.join("a.json"))
    assert io.size(io.join("a.json")) is None

    io.write(io.join("a.json"), b"{}")
    io.write(io.join("sub", "deeper", "b.bin"), b"12345")
    with io.writing(io.join("sub", "c.bin")) as f:
        f.write(b"abc")

    assert io.read(io.join("a.json")) == b"{}"
    with io.open(io.join("sub", "c.bin")) as f:
        assert f.read() == b"abc"
    assert io.exists(io.join("a.json"))
    assert io.size(io.join("sub", "deeper", "b.bin")) == 5
    assert sorted(io.names(io.root)) == ["a.json", "sub"]
    assert io.walk(io.root) == {"a.json": 2, "sub/c.bin": 3, "sub/deeper/b.bin": 5}

    io.rename(io.join("a.json"), io.join("moved", "a.json"))
    assert not io.exists(io.join("a.json"))
    assert io.read(io.join("moved", "a.json")) == b"{}"

    io.remove(io.join("moved", "a.json"))
    io.remove(io.join("moved", "a.json"))  # gone already: no error
    assert not io.exists(io.join("moved", "a.json"))
    io.remove_all([io.join("sub", "c.bin"), io.join("sub", "gone")])
    assert io.walk(io.join("sub")) == {"deeper/b.bin": 5}
    io.delete_tree(io.join("sub"))
    io.delete_tree(io.join("sub"))  # nothing there: no error
    assert io.walk(io.root) == {}


def test_a_name_is_created_once(root_url: str) -> None:
    io = FileIO(root_url)
    path = io.join("x", "marker")
    assert io.create_exclusive(path, b"first")
    assert not io.create_exclusive(path, b"second")
    io.replace(io.join("x", "status"), b"1")
    io.replace(io.join("x", "status"), b"2")
    assert (io.read(path), io.read(io.join("x", "status"))) == (b"first", b"2")
    # No temporary file left beside them.
    assert sorted(io.names(io.join("x"))) == ["marker", "status"]


def test_a_failed_write_leaves_nothing(root_url: str) -> None:
    io = FileIO(root_url)
    io.write(io.join("kept"), b"old")

    def fail() -> None:
        with io.writing(io.join("kept")) as f:
            f.write(b"half")
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        fail()
    if io.local:  # an object store's upload is abandoned by its client
        assert io.read(io.join("kept")) == b"old"
        assert io.names(io.root) == ["kept"]


def test_local_modes_links_and_barriers(tmp_path: Path) -> None:
    io = FileIO(f"file://{tmp_path}/./root/")
    assert io.root == f"{tmp_path}/root"
    io.write(io.join("public"), b"p")
    io.create_exclusive(io.join("private"), b"s")
    assert stat.S_IMODE(os.stat(io.join("public")).st_mode) & 0o022 == 0
    assert stat.S_IMODE(os.stat(io.join("private")).st_mode) & 0o077 == 0
    os.symlink(tmp_path / "nowhere", io.join("dangling"))
    # A link is seen and deleted, never followed.
    assert io.exists(io.join("dangling"))
    assert io.size(io.join("dangling")) is None
    io.delete_tree(io.join("dangling"))
    assert not os.path.lexists(io.join("dangling"))
    io.sync([io.join("public"), io.root])
    io.sync_filesystem()


def test_an_unknown_scheme_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="cannot open URL 'nosuch://x/y'"):
        FileIO("nosuch://x/y")
    with pytest.raises(ConfigurationError, match="cannot open store URL 'nosuch://x/y'"):
        FileIO("nosuch://x/y", store=True)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("/a/b", "/a/b"),
        ("rel/b", "rel/b"),
        ("file:///a/b", "/a/b"),
        ("FILE:///a/b", "/a/b"),
        ("/a://b", "/a://b"),
        ("s3://bucket/key", None),
        ("memory://x", None),
    ],
)
def test_plain_path_follows_is_local(url: str, expected: str | None) -> None:
    assert plain_path(url) == expected
