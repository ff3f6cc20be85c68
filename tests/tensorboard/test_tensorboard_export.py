"""TensorBoard export, checked with TensorBoard's own readers: no mocks.

The run comes from the real PyTorch hook (a few TRAIN steps, then EVAL forwards); the export is
read back with TensorBoard's EventAccumulator (what ``tensorboard --logdir`` builds on) and with
its record reader, which checks every CRC.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator  # noqa: E402
from tensorboard.compat.proto import event_pb2 as tb_event_pb2  # noqa: E402
from tensorboard.compat.tensorflow_stub import errors as tb_errors  # noqa: E402
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402

import trainguard.pytorch as tg  # noqa: E402
from tests import s3_server  # noqa: E402
from trainguard.errors import ConfigError  # noqa: E402
from trainguard.format.record import frame  # noqa: E402
from trainguard.modes import ModeKeys  # noqa: E402
from trainguard.storage import open_store  # noqa: E402
from trainguard.tensorboard import TensorBoardWriter, export_run, make_histogram  # noqa: E402
from trainguard.trial import Trial, create_trial  # noqa: E402

LOSS = "CrossEntropyLoss_output_0"
WEIGHT = "Sequential_0.weight"
GRADIENT = "gradient/Sequential_0.weight"
GRADIENT_L2 = "smdebug/reductions/l2/gradient/Sequential_0.weight"
TRAIN_STEPS, EVAL_STEPS = 3, 2
s3_endpoint = s3_server.s3_endpoint  # the shared moto server fixture; pytest finds it by name
s3_bucket = s3_server.s3_bucket
ALL = {kind: 0 for kind in ("scalars", "histograms", "compressedHistograms", "images", "audio", "tensors")}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tb") / "run"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = tg.Hook(
        out_dir=str(out),
        save_config=tg.SaveConfig(save_interval=1),
        include_collections=["weights", "biases", "gradients", "losses"],
        # The hook's own export at close (smdebug's export_tensorboard) goes through export_run.
        export_tensorboard=True,
        tensorboard_dir=str(out.parent / "hook_board"),
    )
    # A saved reduction next to the raw gradient: it must come out as a scalar.
    hook.get_collection("gradients").reduction_config = tg.ReductionConfig(norms=["l2"], save_raw_tensor=True)
    hook.register_module(model)
    hook.register_loss(criterion)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    model.train()
    for _ in range(TRAIN_STEPS):
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        for _ in range(EVAL_STEPS):
            criterion(model(x), y)
    hook.close()
    return out


@pytest.fixture(scope="module")
def trial(run_dir: Path) -> Trial:
    return create_trial(run_dir)


@pytest.fixture(scope="module")
def exported(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    tb_dir = tmp_path_factory.mktemp("tb") / "board"
    return tb_dir, export_run(run_dir, tb_dir)


def load(directory: Path) -> event_accumulator.EventAccumulator:
    accumulator = event_accumulator.EventAccumulator(str(directory), size_guidance=ALL)
    accumulator.Reload()
    return accumulator


def event_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*tfevents*"))


def read_records(path: Path) -> list[bytes]:
    """Every record via TensorBoard's reader, which raises DataLossError on a bad CRC.

    (EventFileLoader would not do: it swallows DataLossError and just stops, as it must for a
    file still being written.)
    """
    reader = PyRecordReader_New(str(path))
    records = []
    while True:
        try:
            reader.GetNext()
        except tb_errors.OutOfRangeError:
            return records
        records.append(reader.record())


def test_run_has_what_the_export_needs(trial: Trial) -> None:
    assert trial.modes() == [ModeKeys.TRAIN, ModeKeys.EVAL]
    assert trial.steps(ModeKeys.TRAIN) == list(range(TRAIN_STEPS))
    assert trial.steps(ModeKeys.EVAL) == list(range(EVAL_STEPS))
    assert trial.has_tensor(GRADIENT_L2)


def test_hook_exports_at_close(run_dir: Path) -> None:
    board = run_dir.parent / "hook_board"
    for mode, n_steps in (("TRAIN", TRAIN_STEPS), ("EVAL", EVAL_STEPS)):
        assert len(event_files(board / mode)) == 1
        assert [event.step for event in load(board / mode).Scalars(LOSS)] == list(range(n_steps))


def test_scalars_and_histograms_match_the_trial(trial: Trial, exported: tuple[Path, dict[str, int]]) -> None:
    tb_dir, counts = exported
    assert sorted(path.name for path in tb_dir.iterdir()) == ["EVAL", "TRAIN"]
    for mode, n_steps in ((ModeKeys.TRAIN, TRAIN_STEPS), (ModeKeys.EVAL, EVAL_STEPS)):
        accumulator = load(tb_dir / mode.name)
        tags = accumulator.Tags()
        assert LOSS in tags["scalars"]
        scalars = accumulator.Scalars(LOSS)
        assert [event.step for event in scalars] == trial.steps(mode) == list(range(n_steps))
        for event in scalars:
            expected = trial.tensor(LOSS).value(event.step, mode=mode)
            assert event.value == pytest.approx(float(expected), rel=1e-6)
        histograms = accumulator.Histograms(WEIGHT)
        assert [event.step for event in histograms] == list(range(n_steps))
        for event in histograms:
            weight = trial.tensor(WEIGHT).value(event.step, mode=mode)
            histogram = event.histogram_value
            assert histogram.num == weight.size == sum(histogram.bucket)
            assert histogram.min == float(weight.min()) and histogram.max == float(weight.max())
            assert histogram.sum == pytest.approx(float(weight.astype(np.float64).sum()), abs=1e-9)
            assert histogram.sum_squares == pytest.approx(float((weight.astype(np.float64) ** 2).sum()))
            assert len(histogram.bucket_limit) == len(histogram.bucket) == 30
            assert histogram.bucket_limit[-1] == sys.float_info.max
            assert list(histogram.bucket_limit) == sorted(histogram.bucket_limit)
        if mode == ModeKeys.TRAIN:  # gradients and their saved norm exist in training steps only
            assert GRADIENT in tags["histograms"]
            norms = accumulator.Scalars(GRADIENT_L2)
            assert [event.step for event in norms] == list(range(n_steps))
            for event in norms:
                assert event.value == pytest.approx(
                    float(trial.tensor(GRADIENT_L2).value(event.step, mode=mode)), rel=1e-6
                )
        else:
            assert GRADIENT not in tags["histograms"] and GRADIENT_L2 not in tags["scalars"]
    # Per TRAIN step: the loss and 4 gradient norms; 2 weights, 2 biases, 4 gradients.
    # Per EVAL step: the loss; 2 weights, 2 biases.
    assert counts == {
        "scalars": 5 * TRAIN_STEPS + EVAL_STEPS,
        "histograms": 8 * TRAIN_STEPS + 4 * EVAL_STEPS,
        "files": 2,
    }


def test_records_have_real_crcs_and_the_file_version_first(exported: tuple[Path, dict[str, int]]) -> None:
    tb_dir, _ = exported
    for mode, n_steps in (("TRAIN", TRAIN_STEPS), ("EVAL", EVAL_STEPS)):
        [path] = event_files(tb_dir / mode)
        assert path.name.startswith("events.out.tfevents.") and path.name.endswith(".trainguard")
        records = read_records(path)
        events = [tb_event_pb2.Event.FromString(record) for record in records]
        assert events[0].file_version == "brain.Event:2"
        assert [event.step for event in events[1:]] == list(range(n_steps))  # one event per step
    # The reader does check: one flipped payload byte, or smdebug's constant footer, fails it.
    data = bytearray(path.read_bytes())
    data[14] ^= 0xFF
    broken = path.with_name("broken.tfevents")
    broken.write_bytes(bytes(data))
    with pytest.raises(tb_errors.DataLossError):
        read_records(broken)
    broken.write_bytes(frame(tb_event_pb2.Event(file_version="brain.Event:2").SerializeToString()))
    with pytest.raises(tb_errors.DataLossError):
        read_records(broken)


def test_tensorboard_server_data_path_reads_the_histograms(trial: Trial, exported: tuple[Path, dict[str, int]]) -> None:
    """The plugin accumulator behind ``tensorboard --logdir`` turns histo protos into tensors."""
    tb_dir, _ = exported
    accumulator = plugin_event_accumulator.EventAccumulator(str(tb_dir / "TRAIN"), size_guidance=ALL)
    accumulator.Reload()
    assert {LOSS, WEIGHT, GRADIENT_L2} <= set(accumulator.Tags()["tensors"])
    assert accumulator.SummaryMetadata(WEIGHT).plugin_data.plugin_name == "histograms"
    assert accumulator.SummaryMetadata(LOSS).plugin_data.plugin_name == "scalars"
    for event in accumulator.Tensors(WEIGHT):
        buckets = tensor_util.make_ndarray(event.tensor_proto)  # rows of (left, right, count)
        weight = trial.tensor(WEIGHT).value(event.step, mode=ModeKeys.TRAIN)
        assert buckets[:, 2].sum() == weight.size
        assert np.all(buckets[:, 0] <= buckets[:, 1])
        assert buckets[0, 0] == weight.min() and buckets[-1, 1] == weight.max()


def test_scalar_only_and_reexport_replaces_the_previous_files(run_dir: Path, tmp_path: Path) -> None:
    assert export_run(run_dir, tmp_path, histograms=False)["histograms"] == 0
    counts = export_run(run_dir, tmp_path, scalar_only=True)
    assert counts == {"scalars": 5 * TRAIN_STEPS + EVAL_STEPS, "histograms": 0, "files": 2}
    for mode in ("TRAIN", "EVAL"):
        assert len(event_files(tmp_path / mode)) == 1  # the earlier export is gone
        tags = load(tmp_path / mode).Tags()
        assert LOSS in tags["scalars"] and tags["histograms"] == []
        assert [p.name for p in (tmp_path / mode).iterdir() if p.name.startswith(".")] == []  # no temp left


def test_save_histogram_off_skips_that_collections_histograms(run_dir: Path, tmp_path: Path) -> None:
    run_copy = tmp_path / "run"
    shutil.copytree(run_dir, run_copy)
    collections_file = next((run_copy / "collections").rglob("*_collections.json"))
    document = json.loads(collections_file.read_text())
    document["collections"]["weights"]["save_histogram"] = False
    collections_file.write_text(json.dumps(document))
    export_run(run_copy, tmp_path / "board")
    tags = load(tmp_path / "board" / "TRAIN").Tags()
    assert WEIGHT not in tags["histograms"] and "Sequential_0.bias" in tags["histograms"]


def test_make_histogram_counts_infinities_and_leaves_out_nan() -> None:
    values = np.array([np.nan, -np.inf, 1.0, 2.0, 3.0, np.inf], dtype=np.float32)
    histogram = make_histogram(values, bins=4)
    assert histogram is not None
    assert (histogram.min, histogram.max, histogram.num) == (1.0, 3.0, 5.0)
    assert (histogram.sum, histogram.sum_squares) == (6.0, 14.0)
    assert list(histogram.bucket) == [2.0, 0.0, 1.0, 2.0]  # -inf with 1.0 first, +inf with 3.0 last
    assert list(histogram.bucket_limit) == [1.5, 2.0, 2.5, sys.float_info.max]
    assert make_histogram(np.full(5, np.nan)) is None
    constant = make_histogram(np.full((2, 3), 7, dtype=np.int64))
    assert constant is not None and (constant.min, constant.max, sum(constant.bucket)) == (7.0, 7.0, 6.0)
    flags = make_histogram(np.array([True, False, True]), bins=2)
    assert flags is not None and list(flags.bucket) == [1.0, 2.0]
    with pytest.raises(ConfigError):
        make_histogram(np.array(["a", "b"]))
    with pytest.raises(ConfigError):
        make_histogram(values, bins=0)


def test_writer_publishes_only_a_whole_file(tmp_path: Path) -> None:
    writer = TensorBoardWriter(tmp_path)
    writer.add_scalar("loss", 0.5, step=0)
    writer.add_histogram("w", np.arange(10.0), step=0)
    writer.add_scalar("loss", 0.25, step=1)
    assert event_files(tmp_path) == []  # TensorBoard sees nothing until close
    writer.close()
    [path] = event_files(tmp_path)
    events = [tb_event_pb2.Event.FromString(record) for record in read_records(path)]
    assert [(event.step, len(event.summary.value)) for event in events[1:]] == [(0, 2), (1, 1)]
    with pytest.raises(ZeroDivisionError), TensorBoardWriter(tmp_path / "failed") as failing:
        failing.add_scalar("loss", 1.0, step=0)
        raise ZeroDivisionError
    assert list((tmp_path / "failed").iterdir()) == []  # discarded, not published half-done


def test_export_to_s3_reads_back_in_tensorboard(
    run_dir: Path, s3_bucket: str, s3_endpoint: str, tmp_path: Path
) -> None:
    counts = export_run(run_dir, f"s3://{s3_bucket}/board", endpoint_url=s3_endpoint)
    assert counts["files"] == 2
    store = open_store(f"s3://{s3_bucket}/board", endpoint_url=s3_endpoint)
    keys = store.list("")
    assert [key.split("/")[0] for key in keys] == ["EVAL", "TRAIN"] and all(".tfevents." in key for key in keys)
    for key in keys:
        local = tmp_path / key
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(store.read(key))
    scalars = load(tmp_path / "EVAL").Scalars(LOSS)
    assert [event.step for event in scalars] == list(range(EVAL_STEPS))
