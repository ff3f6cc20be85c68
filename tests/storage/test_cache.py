"""CachingStore: reads served from disk, range batching, damaged cache files, and read_ranges."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.s3_server import s3_client
from trainguard.errors import ObjectNotFound
from trainguard.storage import LocalStore, MemoryStore, Store
from trainguard.storage.base import Buffer, StoreWriter
from trainguard.storage.cache import CachingStore, default_cache_dir, read_ranges
from trainguard.storage.s3 import S3Store

DATA = bytes(range(256)) * 400  # 102,400 bytes


class CountingStore:
    """Wraps a store and records every read and size call that reaches it."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.reads: list[tuple[str, int, int | None]] = []
        self.read_threads: set[str] = set()
        self.sizes: list[str] = []
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.inner.url

    def open_writer(self, key: str) -> StoreWriter:
        return self.inner.open_writer(key)

    def write(self, key: str, data: Buffer | Sequence[Buffer]) -> None:
        self.inner.write(key, data)

    def read(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        with self._lock:
            self.reads.append((key, start, length))
            self.read_threads.add(threading.current_thread().name)
        return self.inner.read(key, start, length)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        return self.inner.list(prefix, start_after)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def size(self, key: str) -> int:
        self.sizes.append(key)
        return self.inner.size(key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)


@pytest.fixture
def s3(s3_endpoint: str, s3_bucket: str) -> S3Store:
    return S3Store(s3_bucket, "run", endpoint_url=s3_endpoint)


@pytest.fixture
def counting(s3: S3Store) -> CountingStore:
    s3.write("events/e.tfevents", DATA)
    return CountingStore(s3)


@pytest.fixture
def cached(counting: CountingStore, tmp_path: Path) -> CachingStore:
    return CachingStore(counting, tmp_path / "cache")


def cache_files(cache: CachingStore, suffix: str) -> list[Path]:
    return sorted(cache.directory.rglob(f"*{suffix}"))


def test_second_read_comes_from_disk(cached: CachingStore, counting: CountingStore, s3: S3Store) -> None:
    assert cached.read("events/e.tfevents") == DATA
    assert len(counting.reads) == 1
    # Gone from S3, still served: the bytes can only come from the local disk.
    s3_client(s3.endpoint_url).delete_object(Bucket=s3.bucket, Key=s3.full_key("events/e.tfevents"))
    assert cached.read("events/e.tfevents") == DATA
    assert cached.read("events/e.tfevents", 1000, 10) == DATA[1000:1010]
    assert cached.read("events/e.tfevents", 102_000) == DATA[102_000:]
    assert cached.size("events/e.tfevents") == len(DATA)
    assert cached.exists("events/e.tfevents")
    assert len(counting.reads) == 1
    assert counting.sizes == []


def test_cache_survives_the_store_object(cached: CachingStore, counting: CountingStore, tmp_path: Path) -> None:
    cached.read("events/e.tfevents")
    again = CachingStore(counting, tmp_path / "cache")
    assert again.directory == cached.directory
    assert again.read("events/e.tfevents") == DATA
    assert len(counting.reads) == 1


def test_ranged_reads_are_cached_per_range(cached: CachingStore, counting: CountingStore) -> None:
    assert cached.read("events/e.tfevents", 100, 50) == DATA[100:150]
    assert cached.read("events/e.tfevents", 100, 50) == DATA[100:150]
    assert counting.reads == [("events/e.tfevents", 100, 50)]
    assert cached.read("events/e.tfevents", 100, 60) == DATA[100:160]  # a different range: fetched
    assert len(counting.reads) == 2
    assert cache_files(cached, ".obj") == []  # ranges never pretend to be the whole object


def test_read_ranges_fetches_many_ranges_in_one_get(cached: CachingStore, counting: CountingStore) -> None:
    ranges = [(i * 1000, 16) for i in range(10)]
    assert cached.read_ranges("events/e.tfevents", ranges) == [DATA[s : s + n] for s, n in ranges]
    assert counting.reads == [("events/e.tfevents", 0, None)]
    assert counting.sizes == []
    # Now the whole object is on disk: any later range costs no request.
    assert cached.read_ranges("events/e.tfevents", [(5, 5), (99_000, 100)]) == [DATA[5:10], DATA[99_000:99_100]]
    assert len(counting.reads) == 1


def test_read_ranges_fetches_the_whole_object_when_ranges_cover_much_of_it(
    cached: CachingStore, counting: CountingStore
) -> None:
    ranges = [(0, 20_000), (50_000, 10_000)]  # 30% of the object
    assert cached.read_ranges("events/e.tfevents", ranges) == [DATA[:20_000], DATA[50_000:60_000]]
    assert counting.reads == [("events/e.tfevents", 0, None)]


def test_read_ranges_fetches_few_small_ranges_concurrently(cached: CachingStore, counting: CountingStore) -> None:
    ranges = [(0, 100), (40_000, 100), (90_000, 100)]
    assert cached.read_ranges("events/e.tfevents", ranges) == [DATA[s : s + n] for s, n in ranges]
    assert sorted(counting.reads) == sorted(("events/e.tfevents", s, n) for s, n in ranges)
    assert all(name.startswith("trainguard-range") for name in counting.read_threads)
    assert cached.read_ranges("events/e.tfevents", ranges) == [DATA[s : s + n] for s, n in ranges]
    assert len(counting.reads) == 3
    assert counting.sizes == ["events/e.tfevents"]
    assert cached.read_ranges("events/e.tfevents", []) == []


def test_truncated_cache_file_is_refetched(cached: CachingStore, counting: CountingStore) -> None:
    cached.read("events/e.tfevents")
    (path,) = cache_files(cached, ".obj")
    path.write_bytes(path.read_bytes()[:5000])  # as if the disk filled up mid-copy
    assert cached.read("events/e.tfevents", 4990, 100) == DATA[4990:5090]
    assert cached.read("events/e.tfevents") == DATA
    assert counting.reads == [("events/e.tfevents", 0, None), ("events/e.tfevents", 4990, 100)] + [
        ("events/e.tfevents", 0, None)
    ]
    assert cached.read("events/e.tfevents") == DATA
    assert len(counting.reads) == 3


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw[:8] + bytes([raw[8] ^ 1]) + raw[9:],  # the length in the header
        lambda raw: raw[:-1] + bytes([raw[-1] ^ 0xFF]),  # a flipped byte in the data: CRC mismatch
        lambda raw: b"",  # an empty file
        lambda raw: b"garbage" * 3,
    ],
    ids=["header-length", "flipped-byte", "empty", "garbage"],
)
def test_corrupt_cache_file_is_refetched(cached: CachingStore, counting: CountingStore, damage) -> None:
    cached.read("events/e.tfevents")
    (path,) = cache_files(cached, ".obj")
    path.write_bytes(damage(path.read_bytes()))
    assert cached.read("events/e.tfevents") == DATA
    assert len(counting.reads) == 2
    assert cached.read("events/e.tfevents") == DATA
    assert len(counting.reads) == 2


def test_corrupt_range_file_is_refetched(cached: CachingStore, counting: CountingStore) -> None:
    cached.read("events/e.tfevents", 10, 1000)
    (path,) = cache_files(cached, ".rng")
    path.write_bytes(path.read_bytes()[:-10])
    assert cached.read("events/e.tfevents", 10, 1000) == DATA[10:1010]
    assert len(counting.reads) == 2


def test_no_temp_files_are_left_behind(cached: CachingStore) -> None:
    cached.read("events/e.tfevents", 0, 10)
    cached.read_ranges("events/e.tfevents", [(i, 1) for i in range(6)])
    assert [path for path in cached.directory.rglob("*") if path.name.endswith(".tmp")] == []
    assert (cached.directory / "URL").read_text().strip() == cached.url


def test_missing_objects_are_not_cached(cached: CachingStore) -> None:
    with pytest.raises(ObjectNotFound):
        cached.read("index/late.json")
    cached.write("index/late.json", b"here now")
    assert cached.read("index/late.json") == b"here now"
    assert cached.exists("index/late.json")


def test_list_is_never_cached(cached: CachingStore) -> None:
    assert cached.list("index/") == []
    cached.write("index/a.json", b"a")
    assert cached.list("index/") == ["index/a.json"]


def test_delete_drops_the_cached_copy(cached: CachingStore) -> None:
    cached.read("events/e.tfevents")
    cached.read("events/e.tfevents", 5, 5)
    cached.delete("events/e.tfevents")
    assert cache_files(cached, ".obj") == [] and cache_files(cached, ".rng") == []
    assert not cached.exists("events/e.tfevents")
    with pytest.raises(ObjectNotFound):
        cached.read("events/e.tfevents")


def test_an_unwritable_cache_does_not_break_reads(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"")
    inner = CountingStore(MemoryStore())
    inner.write("k", b"value")
    cached = CachingStore(inner, blocker)
    assert cached.read("k") == b"value"
    assert cached.read("k") == b"value"
    assert len(inner.reads) == 2


def test_cache_folder_per_store_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINGUARD_CACHE_DIR", str(tmp_path / "env-cache"))
    assert default_cache_dir() == tmp_path / "env-cache"
    one = CachingStore(MemoryStore("one"))
    assert one.directory.parent == tmp_path / "env-cache"
    assert CachingStore(MemoryStore("one")).directory == one.directory
    assert CachingStore(MemoryStore("two")).directory != one.directory
    monkeypatch.delenv("TRAINGUARD_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "trainguard"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "trainguard"


def test_caching_store_is_a_store(tmp_path: Path) -> None:
    cached = CachingStore(MemoryStore("x"), tmp_path)
    assert isinstance(cached, Store)
    assert cached.url == "memory://x"


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_read_ranges_on_plain_stores(kind: str, tmp_path: Path) -> None:
    inner: Store = LocalStore(tmp_path) if kind == "local" else MemoryStore()
    store = CountingStore(inner)
    store.write("e", DATA)
    many = [(i * 100, 10) for i in range(6)]
    assert read_ranges(store, "e", many) == [DATA[s : s + n] for s, n in many]
    assert store.reads == [("e", 0, None)]
    few = [(10, 10), (5000, 20)]
    assert read_ranges(store, "e", few) == [DATA[10:20], DATA[5000:5020]]
    assert store.reads[1:] == [("e", 10, 10), ("e", 5000, 20)]
    large = [(0, 30_000)]  # more than a quarter of the object
    assert read_ranges(store, "e", large) == [DATA[:30_000]]
    assert store.reads[-1] == ("e", 0, None)
    assert read_ranges(store, "e", []) == []
    with pytest.raises(ObjectNotFound):
        read_ranges(store, "missing", [(0, 1)])


def test_read_ranges_uses_the_store_own_method(cached: CachingStore, counting: CountingStore) -> None:
    ranges = [(i, 1) for i in range(8)]
    assert read_ranges(cached, "events/e.tfevents", ranges) == [DATA[i : i + 1] for i in range(8)]
    assert counting.reads == [("events/e.tfevents", 0, None)]


def test_uncached_prefixes_always_read_the_inner_store(counting: CountingStore, tmp_path: Path) -> None:
    # The hook rewrites its collections file at close: that key must bypass the cache.
    cached = CachingStore(counting, tmp_path / "cache", uncached_prefixes=("collections/",))
    cached.write("collections/000000000/worker_0_collections.json", b"v1")
    assert cached.read("collections/000000000/worker_0_collections.json") == b"v1"
    cached.write("collections/000000000/worker_0_collections.json", b"version 2")
    assert cached.read("collections/000000000/worker_0_collections.json") == b"version 2"
    assert cached.size("collections/000000000/worker_0_collections.json") == 9
    assert cached.read_ranges("collections/000000000/worker_0_collections.json", [(0, 7)]) == [b"version"]
    assert cache_files(cached, ".obj") == [] and cache_files(cached, ".rng") == []
    assert cached.read("events/e.tfevents") == DATA  # everything else is still cached
    assert len(cache_files(cached, ".obj")) == 1
