"""A record never decides where the job connects (guarantee 9).

Every test here records a watermark step naming a second, real ``redis-server`` (the
"recorded host") that is not the job's configured watermark store, with
``COMMITPUB_REDIS_PASSWORD`` set as in production, and then counts the connections that
server received: none may come from commitpub, since each would have carried the password.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from redis_helpers import RecordedHost

import commitsteps
from commitsteps import FsRenameCommitStep, WatermarkCommitStep
from publisher import Outcome, Publisher
from publisher.context import Context
from store import ForeignStoreError, open_lock, open_store, open_watermarks
from store.connections import Connections, connecting_only
from store.urls import canonical_url

JOB = "job"


@pytest.fixture
def password_in_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COMMITPUB_REDIS_PASSWORD", "the-job-password")
    return "the-job-password"


@pytest.mark.parametrize(
    ("configured", "recorded", "same"),
    [
        ("redis://:secret@Host:6379/0", "redis://host", True),
        ("redis://host:6379/0?password=x", "redis://host:6379/0", True),
        ("redis://host:6379/0", "redis://host:6380/0", False),
        ("redis://host:6379/0", "redis://host:6379/1", False),
        ("redis://host:6379/0", "redis://other:6379/0", False),
        ("redis://host:6379/0", "rediss://host:6379/0", False),
        ("redis://alice@host/0", "redis://mallory@host/0", False),
        ("/srv/state/../state/wm", "file:///srv/state/wm", True),
        ("/srv/state/wm", "/srv/state/wm2", False),
        ("s3://bucket/a/../wm/", "s3://bucket/wm", True),
        ("s3://bucket/wm", "s3://other/wm", False),
    ],
)
def test_urls_compare_by_the_place_they_name(configured: str, recorded: str, same: bool) -> None:
    assert (canonical_url(configured) == canonical_url(recorded)) is same
    assert Connections([configured]).allows(recorded) is same


def test_no_credentials_in_the_canonical_form() -> None:
    assert "secret" not in canonical_url("redis://user:secret@host:6379/0?password=secret")
    with pytest.raises(ForeignStoreError, match="redis://h:6380/0") as e:
        Connections(["redis://:secret@h:6379/0"]).require("redis://h:6380/0", "a step")
    assert "secret" not in str(e.value)


def test_stores_open_only_at_configured_urls_while_connections_are_active(
    recorded_host: RecordedHost, redis_url: str, password_in_env: str
) -> None:
    allowed = Connections([redis_url])
    with connecting_only(allowed):
        open_watermarks(redis_url).close()
        for opener in (open_watermarks, open_store, open_lock):
            with pytest.raises(ForeignStoreError, match=recorded_host.url):
                opener(recorded_host.url)
    # Outside a job's work nothing is restricted: operators' tools open what they name.
    open_watermarks(recorded_host.url).get("d", "p")
    assert recorded_host.connections_since_start() == 1


def _sealed_with_foreign_watermark(
    base: Path, store_url: str, dataset: str, watermarks_url: str
) -> Path:
    """A sealed sequence (rename + watermark) whose watermark step names ``watermarks_url``."""
    staged = base / "staging" / "r1" / dataset / "part-0.dat"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"0123456789")
    dst = base / "output" / dataset / "r1-part-0.dat"
    steps = [
        FsRenameCommitStep.from_staged(str(staged), str(dst)),
        WatermarkCommitStep(watermarks_url, dataset, "0", None, 10),
    ]
    with open_store(store_url) as st:
        st.put_sequence(JOB, dataset, [commitsteps.dumps(s) for s in steps])
    return dst


def _publisher(base: Path, store_url: str, watermarks_url: str) -> Publisher:
    return Publisher(
        store_url,
        JOB,
        staging_roots=[str(base / "staging")],
        output_roots=[str(base / "output")],
        stores=[watermarks_url],
    )


@pytest.mark.redis
def test_recovery_quarantines_a_sequence_naming_another_store_without_connecting(
    tmp_path: Path, redis_url: str, recorded_host: RecordedHost, password_in_env: str
) -> None:
    store_url = str(tmp_path / "steps")
    forged_dst = _sealed_with_foreign_watermark(tmp_path, store_url, "forged", recorded_host.url)
    honest_dst = _sealed_with_foreign_watermark(tmp_path, store_url, "honest", redis_url)
    pub = _publisher(tmp_path, store_url, redis_url)
    report = pub.recover()
    assert report["honest"].outcome == Outcome.RECOVERED
    assert honest_dst.exists()
    forged = report["forged"]
    assert forged.outcome == Outcome.QUARANTINED
    assert forged.error is not None
    assert "ForeignStoreError" in forged.error
    assert recorded_host.url in forged.error  # the recorded URL ...
    assert canonical_url(redis_url) in forged.error  # ... and the configured one
    assert not forged_dst.exists()  # nothing of the sequence ran, not even its rename
    assert pub.store.is_sealed(JOB, "forged")  # kept for the operator
    assert recorded_host.connections_since_start() == 0


@pytest.mark.redis
def test_publish_refuses_steps_naming_another_store_before_write_ahead(
    tmp_path: Path, redis_url: str, recorded_host: RecordedHost, password_in_env: str
) -> None:
    pub = _publisher(tmp_path, str(tmp_path / "steps"), redis_url)
    report = pub.publish({"d": [WatermarkCommitStep(recorded_host.url, "d", "0", None, 5)]})
    assert report["d"].outcome == Outcome.REFUSED
    assert not pub.store.exists(JOB, "d")
    assert recorded_host.connections_since_start() == 0
    # The configured store is fine, and its password-free URL matches the configured one.
    ok = pub.publish({"e": [WatermarkCommitStep(redis_url, "e", "0", None, 5)]})
    assert ok.published == ["e"]


@pytest.mark.redis
def test_discard_refuses_a_sequence_naming_another_store_and_touches_nothing(
    tmp_path: Path, redis_url: str, recorded_host: RecordedHost, password_in_env: str
) -> None:
    store_url = str(tmp_path / "steps")
    _sealed_with_foreign_watermark(tmp_path, store_url, "forged", recorded_host.url)
    staged = tmp_path / "staging" / "r1" / "forged" / "part-0.dat"
    pub = _publisher(tmp_path, store_url, redis_url)
    with pytest.raises(ForeignStoreError, match=recorded_host.url):
        pub.discard("forged")
    assert staged.exists()
    assert pub.store.is_sealed(JOB, "forged")
    assert recorded_host.connections_since_start() == 0


def test_a_publisher_allows_no_store_it_was_not_given(tmp_path: Path) -> None:
    pub = Publisher(str(tmp_path / "steps"), JOB)
    wm = str(tmp_path / "wm")
    report = pub.publish({"d": [WatermarkCommitStep(wm, "d", "0", None, 1)]})
    assert report["d"].outcome == Outcome.REFUSED
    assert "not one this job is configured to use" in (report["d"].error or "")
    assert isinstance(pub.context, Context)
    assert pub.context.connections.allows(str(tmp_path / "steps"))  # its own store


def test_catalogs_come_from_the_configuration_only() -> None:
    import pickle

    from store.connections import active_catalog

    props = {"type": "sql", "uri": "sqlite:////srv/out/catalog.db"}
    connections = Connections(["/srv/wm"], catalogs={"default": props})
    with pytest.raises(ForeignStoreError, match="no job configuration is active"):
        active_catalog("default", "an append step")
    with connecting_only(connections):
        assert dict(active_catalog("default", "an append step")) == props
        with pytest.raises(ForeignStoreError, match="'elsewhere'"):
            active_catalog("elsewhere", "an append step")
    copy = pickle.loads(pickle.dumps(connections))  # noqa: S301 -- our own bytes
    assert copy == connections
    assert dict(copy.catalog("default", "x")) == props
