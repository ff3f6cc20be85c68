"""A local job that tries what a job must not do, reports each outcome, then trains normally.

``python job_attacks.py DATA_DIR OTHER_JOB OWN_JOB API_CWD -- TRAIN_ARGS...``: it is given no
secret, only where the API keeps its state and runs. It prints one line ``ATTACKS <json>``: each attempt's outcome
(``"denied: <error>"`` or what it got), its uid, cwd and whole environment; then it runs
train_script.py with TRAIN_ARGS in this process, so the job captures and its rules run as usual.
"""

from __future__ import annotations

import json
import os
import runpy
import sqlite3
import sys
from pathlib import Path


def _attempt(action) -> str:  # noqa: ANN001
    try:
        got = action()
    except OSError as error:
        return f"denied: {type(error).__name__}: {error.strerror or error}"
    except sqlite3.Error as error:
        return f"denied: {type(error).__name__}: {error}"
    return f"GOT: {got!r}"[:2000]


def _api_pids() -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"trainguard.services.api" in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return pids


def _write(path: Path) -> str:
    with open(path, "w") as handle:
        handle.write("written by a job\n")
    return f"wrote {path}"


def _database_write(path: Path) -> str:
    connection = sqlite3.connect(f"file:{path}?mode=rw", uri=True)
    try:
        connection.execute("UPDATE jobs SET status = 'Completed'")
        connection.commit()
    finally:
        connection.close()
    return "updated the jobs table"


def main() -> None:
    separator = sys.argv.index("--")
    data_dir, other_job, own_job, api_cwd = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
    train_args = sys.argv[separator + 1 :]
    api_pids = _api_pids()
    outcomes: dict[str, str] = {}
    for name in ("trainguard.db", "keys", "credentials.json"):
        outcomes[f"read {name}"] = _attempt(lambda n=name: (data_dir / n).read_bytes())
    outcomes["open the database"] = _attempt(lambda: _database_write(data_dir / "trainguard.db"))
    outcomes["list the data dir"] = _attempt(lambda: os.listdir(data_dir))
    outcomes["list the jobs"] = _attempt(lambda: os.listdir(data_dir / "jobs"))
    outcomes["list the launcher's files"] = _attempt(lambda: os.listdir(data_dir / "local"))
    outcomes["read the other job's files"] = _attempt(
        lambda: (data_dir / "jobs" / other_job / "debughookconfig.json").read_text()
    )
    outcomes["read its rule runner's spec"] = _attempt(
        lambda: (data_dir / "local" / own_job / "rule--LossWatch" / "spec.json").read_text()
    )
    if not api_pids:
        raise SystemExit("no API process found")
    outcomes["read the API's environment"] = _attempt(
        lambda: [Path(f"/proc/{pid}/environ").read_bytes() for pid in api_pids]
    )
    outcomes["signal the API"] = _attempt(lambda: [os.kill(pid, 0) for pid in api_pids] or None)
    outcomes["write into the data dir"] = _attempt(lambda: _write(data_dir / "job-was-here"))
    outcomes["write into the jobs dir"] = _attempt(lambda: _write(data_dir / "jobs" / "job-was-here"))
    outcomes["write into the other job"] = _attempt(lambda: _write(data_dir / "jobs" / other_job / "job-was-here"))
    outcomes["forge its exit code"] = _attempt(lambda: _write(data_dir / "local" / own_job / "training" / "exit_code"))
    outcomes["write into the API's working directory"] = _attempt(lambda: _write(api_cwd / "job-was-here"))
    os.symlink(data_dir, "escape")
    outcomes["write through a link to the data dir"] = _attempt(lambda: _write(Path("escape") / "job-was-here"))
    outcomes["own directory"] = _attempt(lambda: _write(Path("own-file")))
    outcomes["home"] = _attempt(lambda: _write(Path(os.environ["HOME"]) / "home-file"))
    outcomes["tmp"] = _attempt(lambda: _write(Path(os.environ["TMPDIR"]) / "tmp-file"))
    report = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "cwd": os.getcwd(),
              "environment": dict(os.environ), "outcomes": outcomes}  # fmt: skip
    print("ATTACKS " + json.dumps(report), flush=True)
    sys.argv = [str(Path(__file__).with_name("train_script.py")), *train_args]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
