"""URL dispatch, URL helpers and the byte formats of the store layer."""

from __future__ import annotations

import copy
import importlib
import pickle
import re
import sys
import time
import zlib
from typing import Any

import pytest
from framing_helpers import frame_record

import store
from store import (
    BackendNotInstalledError,
    CommitPubError,
    ConfigurationError,
    CorruptRecordError,
    CredentialsInUrlError,
    NewerFormatError,
)
from store import registry as registry_module
from store.framing import (
    CHUNK_MAGIC,
    decode_chunk_header,
    encode_chunk,
    iter_chunk_records,
    unframe_record,
)
from store.redis import RedisCommitStepStore
from store.urls import (
    decode_name,
    encode_name,
    has_credentials,
    redact,
    redis_password,
    require_no_credentials,
    url_problem,
)


@pytest.fixture
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let a test register schemes without leaking them into the rest of the session."""
    monkeypatch.setattr(registry_module, "_REGISTRY", copy.deepcopy(registry_module._REGISTRY))


# -- open_store ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "url",
    [
        "",
        "nosuchscheme://bucket/x",
        "redis://host:notaport/0",
        "redis://:s3cret@host:notaport/0",
        "redis://:s3cret@[bad/0",
        "s3://key:s3cret@[bad/x",
    ],
)
def test_bad_urls_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        store.open_store(url)
    assert "s3cret" not in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        store.open_watermarks(url)
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize("url", [None, 42, b"/tmp/x"], ids=repr)
def test_non_string_urls_are_configuration_errors(url: Any) -> None:
    with pytest.raises(ConfigurationError):
        store.open_store(url)


def test_errors_derive_from_matching_builtins() -> None:
    assert issubclass(ConfigurationError, ValueError)
    assert issubclass(ConfigurationError, CommitPubError)
    assert issubclass(store.StoreUnavailableError, ConnectionError)
    assert issubclass(CorruptRecordError, ValueError)
    assert issubclass(BackendNotInstalledError, ImportError)


def test_redis_password_is_redacted() -> None:
    # Opening does not connect, so no server is needed.
    with store.open_store("redis://:s3cret@127.0.0.1:6379/0") as s:
        assert isinstance(s, RedisCommitStepStore)
        assert s.url == "redis://:***@127.0.0.1:6379/0"
        assert "s3cret" not in repr(s)
    with store.open_store("rediss://user:s3cret@cache.example/2") as s:
        assert s.url == "rediss://user:***@cache.example/2"
    wm = store.open_watermarks("redis://:s3cret@127.0.0.1:6379/0")
    try:
        assert "s3cret" not in wm.url
        assert "s3cret" not in repr(wm)
    finally:
        wm.close()


def test_pickled_redis_store_leaves_its_password_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    # Executors reconnect with the password of their own environment (tests/test_store_redis.py
    # shows it against a server that requires one).
    monkeypatch.setenv("COMMITPUB_REDIS_PASSWORD", "from-the-executor")
    with store.open_store("redis://:s3cret@127.0.0.1:6379/0") as s:
        copy_ = pickle.loads(pickle.dumps(s))  # noqa: S301 -- our own bytes
        with copy_:
            assert s.url == copy_.url == "redis://:***@127.0.0.1:6379/0"
            kwargs = copy_._client.connection_pool.connection_kwargs
            assert kwargs["password"] == "from-the-executor"


def test_register_backend_refuses_a_taken_scheme(isolated_registry: None) -> None:
    with pytest.raises(ConfigurationError, match="already registered"):
        store.register_backend("commit_stores", "redis", "elsewhere:OtherStore")
    store.register_backend("commit_stores", "redis", "store.redis:RedisCommitStepStore")
    store.register_backend("commit_stores", "mine", "store.fs:FsCommitStepStore")
    with pytest.raises(ConfigurationError, match="already registered"):
        store.register_backend("commit_stores", "mine", "store.redis:RedisCommitStepStore")
    store.register_backend("commit_stores", "mine", "elsewhere:Other", clobber=True)
    assert registry_module._REGISTRY["commit_stores"]["mine"].target == "elsewhere:Other"


class UrlEchoStore:
    """Stands in for an outside backend: registered by "module:Class", built from the URL."""

    def __init__(self, url: str) -> None:
        self.url = url


def test_registered_backend_is_used(isolated_registry: None) -> None:
    store.register_backend("commit_stores", "echo", f"{__name__}:UrlEchoStore")
    store.register_backend("watermark_stores", "echo", f"{__name__}:UrlEchoStore")
    opened: Any = store.open_store("echo://bucket/prefix")
    assert isinstance(opened, UrlEchoStore)
    assert opened.url == "echo://bucket/prefix"
    assert isinstance(store.open_watermarks("echo://x"), UrlEchoStore)


def test_missing_backend_module_names_the_install_hint(isolated_registry: None) -> None:
    store.register_backend(
        "commit_stores",
        "absent",
        "commitpub_no_such_module:Store",
        hint="pip install 'commitpub[absent]'",
    )
    with pytest.raises(BackendNotInstalledError, match=r"pip install 'commitpub\[absent\]'"):
        store.open_store("absent://x")


# -- URL helpers ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
        ("s3://key:secret@bucket/p", "s3://key:***@bucket/p"),
        ("redis://h:1/0", "redis://h:1/0"),
        ("/plain/path", "/plain/path"),
        ("s3://user@bucket/p", "s3://user@bucket/p"),
        ("redis://h:1/0?password=pw&db=2", "redis://h:1/0?password=***&db=2"),
        (
            "rediss://h/0?ssl_cert_reqs=none&Password=x",
            "rediss://h/0?ssl_cert_reqs=none&Password=***",
        ),
        ("s3://bucket/p?versionId=3", "s3://bucket/p?versionId=3"),
        ("postgresql://u:pw@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u@h/db?password=pw", "postgresql://u@h/db?password=***"),
    ],
)
def test_redact(url: str, expected: str) -> None:
    assert expected == redact(url)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://:pw@h:port/0", "redis://***"),
        ("s3://k:pw@[x/p", "s3://***"),
        ("postgresql://u:pw@h:x/db", "postgresql://***"),
        ("//[x", "***"),
    ],
)
def test_redact_unparseable(url: str, expected: str) -> None:
    assert redact(url) == expected


def test_require_no_credentials() -> None:
    assert require_no_credentials("s3://bucket/x", "src") == "s3://bucket/x"
    assert not has_credentials("/a:b@c")
    assert not has_credentials("//[odd but valid path")
    assert not has_credentials("/a://[b")
    with pytest.raises(ConfigurationError, match="malformed"):
        has_credentials("s3://key:pw@[bad/x")
    with pytest.raises(CredentialsInUrlError) as info:
        require_no_credentials("s3://key:topsecret@bucket/x", "src")
    assert "topsecret" not in str(info.value)
    assert "src" in str(info.value)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis//localhost:6379/0", "looks like a mistyped redis:// URL"),
        ("redis:/localhost:6379/0", "looks like a mistyped redis:// URL"),
        ("S3:/bucket/x", "looks like a mistyped s3:// URL"),
        ("redis://h:6379/0/extra", "database number and nothing else (/0), got '/0/extra'"),
        ("redis://h:6379/1/2", "got '/1/2'"),
        ("rediss://:pw@h:6379/x", "got '/x'"),
        ("redis://h:port/0", "not a well-formed URL"),
        ("redis:///0", "names no host"),
        ("s3:///prefix", "names no bucket (s3://bucket/prefix)"),
        ("gs:///prefix", "names no bucket (gs://bucket/prefix)"),
        ("unix://", "names no socket"),
        ("redis+sentinel://:pw@h1:x/svc", "names no Sentinels as host[:port]"),
        ("redis+sentinel://:pw@h1:26379/", "the path of a Sentinel URL is the service name"),
        ("redis+sentinel://h1:26379/svc/db", "got '/svc/db'"),
        ("postgresql//h/db", "looks like a mistyped postgresql:// URL"),
        ("postgresql:/h/db", "looks like a mistyped postgresql:// URL"),
        ("postgresql://u:pw@h:port/db", "not a well-formed URL"),
    ],
)
def test_url_problem_names_what_is_wrong(url: str, problem: str) -> None:
    found = url_problem(url)
    assert found is not None
    assert problem in found
    assert "pw" not in found


@pytest.mark.parametrize(
    "url",
    [
        "state/steps",
        "./redis//x",
        "/srv/redis:6379",
        "redis/steps",
        "file:///srv/x",
        "redis://h:6379/0",
        "redis://h",
        "rediss://user:pw@h:6380/15?ssl_cert_reqs=none",
        "unix:///run/redis.sock?db=1",
        "s3://bucket",
        "memory://x",
        "mystore+x://anything/at/all",
        "redis+sentinel://h1:26379/mymaster",
        "redis+sentinel://:pw@h1:26379,h2:26380,[::1]/mymaster/3",
        "postgresql://u@h:5432/db?sslmode=require",
        "postgresql:///db",
    ],
)
def test_url_problem_passes_well_formed_urls_and_paths(url: str) -> None:
    assert url_problem(url) is None


def test_redis_password_of_a_url() -> None:
    assert redis_password("redis://:s%40cret@h:6379/0") == "s@cret"
    assert redis_password("rediss://user:pw@h/0") == "pw"
    assert redis_password("redis://h/0?password=q&db=1") == "q"
    assert redis_password("redis://h/0") is None
    assert redis_password("s3://key:pw@bucket/x") is None
    assert redis_password("state/steps") is None


@pytest.mark.parametrize(
    "name", ["plain", "a/b", ".hidden", "..", "%", "{x}", "日本", "sp ace", "~=+,@-_"]
)
def test_encode_name_round_trip(name: str) -> None:
    encoded = encode_name(name, "dataset")
    assert name == decode_name(encoded)
    assert "/" not in encoded
    assert not encoded.startswith(".")
    assert "{" not in encoded
    assert "}" not in encoded


@pytest.mark.parametrize("name", ["", "x" * 241, "日" * 30], ids=["empty", "long", "long-cjk"])
def test_encode_name_rejects_empty_and_long(name: str) -> None:
    with pytest.raises(ConfigurationError):
        encode_name(name, "dataset")


# -- framing ---------------------------------------------------------------------------------
@pytest.mark.parametrize("payload", [b"", b"x", bytes(range(256)) * 4])
def test_frame_round_trip(payload: bytes) -> None:
    framed = frame_record(payload)
    assert payload == unframe_record(framed, "here")
    assert len(payload) + 5 == len(framed)


def test_unframe_rejects_every_truncation_and_flip() -> None:
    framed = frame_record(b"payload")
    for length in range(len(framed)):
        with pytest.raises(CorruptRecordError):
            unframe_record(framed[:length], "here")
    for offset in range(len(framed)):
        altered = bytearray(framed)
        altered[offset] ^= 0x80
        # The version byte is the one byte no checksum covers: raised, it reads as a newer
        # format's record (tests/test_format_versions.py), refused all the same.
        with pytest.raises(NewerFormatError if offset == 0 else CorruptRecordError):
            unframe_record(bytes(altered), "here")


def test_unframe_error_names_the_place() -> None:
    with pytest.raises(CorruptRecordError, match="store/x\\[3\\]"):
        unframe_record(b"", "store/x[3]")


@pytest.mark.parametrize("records", [[], [b""], [b"a", b"bb", b""], [b"z" * 70_000]])
def test_chunk_round_trip(records: list[bytes]) -> None:
    data = encode_chunk("urn/ü", 3, records, sealed=True, token=9)
    header, _offset = decode_chunk_header(data, "chunk")
    assert time.time() - 60 < header.pop("written") <= time.time() + 0.001  # rounded to ms
    assert {"urn": "urn/ü", "index": 3, "count": len(records), "sealed": True, "token": 9} == header
    assert records == list(iter_chunk_records(data, "chunk"))
    assert data.startswith(CHUNK_MAGIC)


def test_chunk_truncated_at_every_offset_is_rejected() -> None:
    data = encode_chunk("ds", 0, [b"one", b"", b"three"], sealed=False)
    for length in range(len(data)):
        with pytest.raises(CorruptRecordError):
            list(iter_chunk_records(data[:length], "chunk"))


def test_chunk_with_any_flipped_byte_is_rejected() -> None:
    data = encode_chunk("ds", 0, [b"one", b"", b"three"], sealed=True)
    for offset in range(len(data)):
        altered = bytearray(data)
        altered[offset] ^= 0x01
        with pytest.raises(CorruptRecordError):
            list(iter_chunk_records(bytes(altered), "chunk"))


def _reseal(body: bytes) -> bytes:
    """A chunk body with a valid trailer, to reach the checks behind the checksum."""
    return body + b"CPEND" + zlib.crc32(body).to_bytes(4, "big")


def test_chunk_count_mismatch_is_rejected_even_with_a_valid_checksum() -> None:
    data = encode_chunk("ds", 0, [b"one", b"two"], sealed=True)
    body = data[: -len(b"CPEND") - 4]
    forged = body.replace(b'"count":2', b'"count":3')
    with pytest.raises(CorruptRecordError, match="header says 3 records, found 2"):
        list(iter_chunk_records(_reseal(forged), "chunk"))


def test_chunk_record_running_past_the_end_is_rejected() -> None:
    data = encode_chunk("ds", 0, [b"one"], sealed=True)
    body = data[: -len(b"CPEND") - 4]
    # Make the last record's length field claim more bytes than the chunk holds.
    framed_len = len(frame_record(b"one"))
    at = len(body) - framed_len - 4
    forged = body[:at] + (framed_len + 50).to_bytes(4, "big") + body[at + 4 :]
    with pytest.raises(CorruptRecordError, match="runs past the chunk end"):
        list(iter_chunk_records(_reseal(forged), "chunk"))


@pytest.mark.parametrize("header", [b"{broken", b"[1]", b'{"count": "2"}'])
def test_chunk_with_bad_header_is_rejected(header: bytes) -> None:
    body = CHUNK_MAGIC + len(header).to_bytes(4, "big") + header
    with pytest.raises(CorruptRecordError, match="header"):
        list(iter_chunk_records(_reseal(body), "chunk"))


def test_password_in_a_query_parameter_counts_as_credentials() -> None:
    assert has_credentials("redis://h:6379/0?password=pw")
    with pytest.raises(CredentialsInUrlError, match=r"password=\*\*\*"):
        require_no_credentials("redis://h:6379/0?password=pw", "watermarks.url")


@pytest.mark.parametrize(
    ("url", "module", "extra"),
    [
        ("gs://bucket/steps", "gcsfs", "gcs"),
        ("az://container/steps", "adlfs", "azure"),
        ("abfs://container/steps", "adlfs", "azure"),
        ("s3://bucket/steps", "s3fs", "s3"),
    ],
)
def test_object_store_without_its_client_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, url: str, module: str, extra: str
) -> None:
    # As if the client were not installed: fsspec imports it on first use of the scheme
    # (the module, which fsspec's package shadows with its mapping of the same name).
    loaded = importlib.import_module("fsspec.registry")._registry
    monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.delitem(loaded, url.split("://", 1)[0], raising=False)
    with pytest.raises(ConfigurationError, match=re.escape(f"pip install 'commitpub[{extra}]'")):
        store.open_store(url)
