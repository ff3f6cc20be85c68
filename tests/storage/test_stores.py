"""One conformance suite, run against every Store: local, memory, S3 (moto server) and cached S3."""

from __future__ import annotations

import random

import pytest

from tests.s3_server import s3_client
from trainguard.errors import ObjectNotFound, StorageError
from trainguard.storage import LocalStore, MemoryStore, Store, open_store
from trainguard.storage.cache import CachingStore
from trainguard.storage.s3 import MIN_PART_SIZE, S3Store

RUN_KEYS = [
    "collections/000000000/worker_0_collections.json",
    "events/000000000000/000000000000_worker_0.tfevents",
    "events/000000000001/000000000001_worker_0.tfevents",
    "events/000000000001/000000000001_worker_1.tfevents",
    "index/000000000/000000000000_worker_0.json",
    "index/000000000/000000000001_worker_0.json",
    "index/000000000/000000000001_worker_1.json",
    "index/000000001/000000001000_worker_0.json",
    "training_job_end.ts",
]
INDEX_KEYS = [key for key in RUN_KEYS if key.startswith("index/")]


def s3_of(store: Store) -> S3Store | None:
    inner = store.inner if isinstance(store, CachingStore) else store
    return inner if isinstance(inner, S3Store) else None


def populate(store: Store, keys: list[str]) -> None:
    shuffled = list(keys)
    random.Random(7).shuffle(shuffled)  # stores must sort, not rely on write order
    for key in shuffled:
        store.write(key, key.encode())


def test_implements_the_protocol(store: Store) -> None:
    assert isinstance(store, Store)


def test_write_and_read_back(store: Store) -> None:
    store.write("a.bin", b"hello world")
    store.write("parts.bin", [b"ab", bytearray(b"cd"), memoryview(b"ef")])
    store.write("empty.bin", b"")
    assert store.read("a.bin") == b"hello world"
    assert store.read("parts.bin") == b"abcdef"
    assert store.read("empty.bin") == b""


def test_ranged_read(store: Store) -> None:
    store.write("r.bin", bytes(range(100)))
    assert store.read("r.bin", 10, 5) == bytes(range(10, 15))
    assert store.read("r.bin", 95) == bytes(range(95, 100))
    assert store.read("r.bin", 0, 3) == b"\x00\x01\x02"
    assert store.read("r.bin", 90, 50) == bytes(range(90, 100))  # past the end: what there is
    assert store.read("r.bin", 100) == b""
    assert store.read("r.bin", 200, 10) == b""
    assert store.read("r.bin", 5, 0) == b""


def test_writer_streams_and_is_invisible_until_commit(store: Store) -> None:
    writer = store.open_writer("index/000000000/000000000001_worker_0.json")
    for chunk in (b"{", b'"step": 1', bytearray(b", "), memoryview(b'"x": 2}')):
        writer.write(chunk)
    assert not store.exists("index/000000000/000000000001_worker_0.json")
    assert store.list() == []
    assert store.list("index/") == []
    with pytest.raises(ObjectNotFound):
        store.read("index/000000000/000000000001_worker_0.json")
    writer.commit()
    assert store.read("index/000000000/000000000001_worker_0.json") == b'{"step": 1, "x": 2}'
    assert store.list() == ["index/000000000/000000000001_worker_0.json"]


def test_abort_leaves_nothing(store: Store) -> None:
    writer = store.open_writer("events/000000000001/000000000001_worker_0.tfevents")
    writer.write(b"x" * 1000)
    writer.abort()
    assert not store.exists("events/000000000001/000000000001_worker_0.tfevents")
    assert store.list() == []
    if isinstance(store, LocalStore):
        assert [path for path in store.root.rglob("*") if path.is_file()] == []


def test_local_store_never_lists_its_temp_files(tmp_path) -> None:
    store = LocalStore(tmp_path)
    store.write("index/000000000/000000000000_worker_0.json", b"0")
    writer = store.open_writer("index/000000000/000000000001_worker_0.json")
    writer.write(b"partial")
    hidden = [path.name for path in (tmp_path / "index" / "000000000").iterdir() if path.name.startswith(".")]
    assert hidden, "the writer should be streaming into a hidden temp file"
    assert store.list() == ["index/000000000/000000000000_worker_0.json"]
    assert store.list("index/000000000/") == ["index/000000000/000000000000_worker_0.json"]
    writer.commit()
    assert store.list("index/") == [
        "index/000000000/000000000000_worker_0.json",
        "index/000000000/000000000001_worker_0.json",
    ]


def test_list_is_sorted_and_filtered_by_prefix(store: Store) -> None:
    populate(store, RUN_KEYS)
    assert store.list() == RUN_KEYS
    assert store.list("index/") == INDEX_KEYS
    assert store.list("index/000000000/") == INDEX_KEYS[:3]
    assert store.list("index/000000000/000000000001") == INDEX_KEYS[1:3]
    assert store.list("events/000000000001/") == RUN_KEYS[2:4]
    assert store.list("train") == ["training_job_end.ts"]
    assert store.list("nothing/") == []


def test_list_start_after(store: Store) -> None:
    populate(store, RUN_KEYS)
    assert store.list("index/", start_after=INDEX_KEYS[1]) == INDEX_KEYS[2:]
    assert store.list("index/", start_after=INDEX_KEYS[-1]) == []
    # A key that does not exist (a reader's cursor) and one that sorts before the prefix.
    assert store.list("index/", start_after="index/000000000/000000000001_worker_0.jsoo") == INDEX_KEYS[2:]
    assert store.list("index/", start_after="collections/") == INDEX_KEYS
    # A cursor in an earlier "directory" skips it whole and keeps the later ones.
    assert store.list("index/", start_after="index/000000000/zzz") == INDEX_KEYS[3:]
    assert store.list(start_after="index/") == INDEX_KEYS + ["training_job_end.ts"]
    assert store.list(start_after="training_job_end.ts") == []


def test_list_follows_a_growing_run(store: Store) -> None:
    store.write(INDEX_KEYS[0], b"0")
    cursor = store.list("index/")[-1]
    store.write(INDEX_KEYS[1], b"1")
    store.write(INDEX_KEYS[3], b"3")
    assert store.list("index/", start_after=cursor) == [INDEX_KEYS[1], INDEX_KEYS[3]]


def test_list_sorts_in_byte_order_across_directories(store: Store) -> None:
    # Directory "a" holds keys "a/..." which sort after "a-z" and "a.txt" ("-" and "." < "/").
    populate(store, ["a/b", "a.txt", "a-z", "ab"])
    assert store.list() == ["a-z", "a.txt", "a/b", "ab"]


def test_exists_size_delete(store: Store) -> None:
    store.write("events/000000000000/000000000000_worker_0.tfevents", b"x" * 1234)
    assert store.exists("events/000000000000/000000000000_worker_0.tfevents")
    assert store.size("events/000000000000/000000000000_worker_0.tfevents") == 1234
    assert not store.exists("events/000000000000/other")
    store.delete("events/000000000000/000000000000_worker_0.tfevents")
    assert not store.exists("events/000000000000/000000000000_worker_0.tfevents")
    assert store.list() == []
    store.delete("events/000000000000/000000000000_worker_0.tfevents")  # deleting nothing is fine


def test_missing_keys_raise_object_not_found(store: Store) -> None:
    for call in (lambda: store.read("missing.json"), lambda: store.read("missing.json", 5, 5)):
        with pytest.raises(ObjectNotFound, match="missing.json") as caught:
            call()
        assert isinstance(caught.value, StorageError) and isinstance(caught.value, FileNotFoundError)
    with pytest.raises(ObjectNotFound, match="missing.json"):
        store.size("missing.json")
    s3 = s3_of(store)
    if s3 is not None:
        with pytest.raises(ObjectNotFound, match=f"s3://{s3.bucket}/"):
            store.read("missing.json")


def test_large_object_streams_through_multipart(store: Store) -> None:
    chunk = random.Random(1).randbytes(1 << 20)
    total = 2 * MIN_PART_SIZE + 12345
    writer = store.open_writer("events/big.tfevents")
    written = 0
    while written < total:
        part = chunk[: total - written]
        writer.write(part)
        written += len(part)
    assert not store.exists("events/big.tfevents")
    writer.commit()
    expected = (chunk * (total // len(chunk) + 1))[:total]
    assert store.size("events/big.tfevents") == total
    assert store.read("events/big.tfevents") == expected
    boundary = MIN_PART_SIZE - 10
    assert store.read("events/big.tfevents", boundary, 20) == expected[boundary : boundary + 20]
    # write() of a sequence larger than one part takes the same path.
    store.write("events/big2.tfevents", [expected[:MIN_PART_SIZE], expected[MIN_PART_SIZE:]])
    assert store.read("events/big2.tfevents") == expected
    s3 = s3_of(store)
    if s3 is not None:
        client = s3_client(s3.endpoint_url)
        for key, parts in (("events/big.tfevents", 3), ("events/big2.tfevents", 3)):
            etag = client.head_object(Bucket=s3.bucket, Key=s3.full_key(key))["ETag"]
            assert etag.strip('"').endswith(f"-{parts}"), f"{key} was not uploaded in {parts} parts: ETag {etag}"


def test_object_of_exactly_one_part_goes_in_one_put(store: Store) -> None:
    s3 = s3_of(store)
    if s3 is None:
        pytest.skip("S3 only")
    store.write("one.bin", b"y" * MIN_PART_SIZE)
    etag = s3_client(s3.endpoint_url).head_object(Bucket=s3.bucket, Key=s3.full_key("one.bin"))["ETag"]
    assert "-" not in etag


def test_aborted_multipart_upload_leaves_nothing(store: Store) -> None:
    s3 = s3_of(store)
    if s3 is None:
        pytest.skip("S3 only")
    writer = store.open_writer("events/aborted.tfevents")
    writer.write(b"z" * (MIN_PART_SIZE + 1))  # more than a part: the multipart upload has begun
    client = s3_client(s3.endpoint_url)
    assert client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads")
    writer.abort()
    assert not client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads")
    assert not store.exists("events/aborted.tfevents")
    assert store.list() == []


def test_writer_refuses_use_after_commit(store: Store) -> None:
    if not isinstance(s3_of(store), S3Store):
        pytest.skip("only the S3 writer guards this")
    writer = store.open_writer("k")
    writer.commit()
    with pytest.raises(StorageError):
        writer.write(b"more")


def test_s3_url_and_keys(s3_endpoint: str, s3_bucket: str) -> None:
    assert S3Store(s3_bucket, "a/b/", endpoint_url=s3_endpoint).url == f"s3://{s3_bucket}/a/b"
    assert S3Store(s3_bucket, "", endpoint_url=s3_endpoint).url == f"s3://{s3_bucket}"
    store = S3Store.from_url(f"s3://{s3_bucket}/runs/1", endpoint_url=s3_endpoint)
    store.write("index/x.json", b"1")
    assert s3_client(s3_endpoint).get_object(Bucket=s3_bucket, Key="runs/1/index/x.json")["Body"].read() == b"1"


def test_s3_uses_a_client_it_is_given(s3_endpoint: str, s3_bucket: str) -> None:
    client = s3_client(s3_endpoint)
    store = S3Store.from_url(f"s3://{s3_bucket}/given", client=client)
    assert store._client is client
    store.write("k", b"v")
    assert client.get_object(Bucket=s3_bucket, Key="given/k")["Body"].read() == b"v"


def test_s3_list_skips_folder_markers(s3_endpoint: str, s3_bucket: str) -> None:
    client = s3_client(s3_endpoint)
    client.put_object(Bucket=s3_bucket, Key="run/", Body=b"")
    client.put_object(Bucket=s3_bucket, Key="run/index/", Body=b"")
    store = S3Store(s3_bucket, "run", endpoint_url=s3_endpoint)
    store.write("index/a.json", b"a")
    assert store.list() == ["index/a.json"]


def test_s3_list_paginates(s3_endpoint: str, s3_bucket: str) -> None:
    store = S3Store(s3_bucket, "p", endpoint_url=s3_endpoint)
    keys = [f"index/{i:04d}.json" for i in range(7)]
    for key in keys:
        store.write(key, b"")

    def small_pages(params: dict, **_: object) -> None:
        params["MaxKeys"] = 2  # S3 pages hold up to 1000 keys; 2 makes four pages of seven keys

    pages = []
    store._client.meta.events.register("before-parameter-build.s3.ListObjectsV2", small_pages)
    store._client.meta.events.register("after-call.s3.ListObjectsV2", lambda **kwargs: pages.append(1))
    assert store.list() == keys
    assert len(pages) == 4
    assert store.list("index/", start_after="index/0002.json") == keys[3:]


def test_open_store_memory_and_local(tmp_path) -> None:
    memory = open_store("memory://storage-tests")
    assert isinstance(memory, MemoryStore)
    assert open_store("memory://storage-tests") is memory
    memory.write("k", b"v")
    assert open_store("memory://storage-tests").read("k") == b"v"
    local = open_store(tmp_path / "run")
    assert isinstance(local, LocalStore) and local.root == tmp_path / "run"
    assert isinstance(open_store(f"file://{tmp_path}/run"), LocalStore)
    assert isinstance(open_store(str(tmp_path)), LocalStore)


def test_local_store_maps_a_whole_file_read_only(tmp_path) -> None:
    store = LocalStore(tmp_path)
    payload = bytes(range(256)) * 64
    store.write("events/a.tfevents", payload)
    store.write("events/empty", b"")
    mapped = store.read_mapped("events/a.tfevents")
    assert mapped.readonly and bytes(mapped) == payload == store.read("events/a.tfevents")
    assert bytes(mapped[300:310]) == payload[300:310]
    assert bytes(store.read_mapped("events/empty")) == b""
    with pytest.raises(ObjectNotFound):
        store.read_mapped("events/missing")
    # a published file is replaced by rename, never rewritten in place: the mapping keeps the old bytes
    store.write("events/a.tfevents", b"new")
    assert bytes(mapped[:4]) == payload[:4]
