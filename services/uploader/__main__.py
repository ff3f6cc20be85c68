"""``python -m trainguard.services.uploader --source DIR --dest s3://bucket/prefix [--endpoint-url URL]
[--state-file PATH] [--status-file PATH] [--poll-interval 0.5]``; env fallbacks UPLOADER_SOURCE,
UPLOADER_DEST, S3_ENDPOINT_URL, UPLOADER_STATE_FILE, UPLOADER_STATUS_FILE, UPLOADER_POLL_INTERVAL,
UPLOADER_DRAIN_S, UPLOADER_GIVE_UP_AFTER_S, UPLOADER_VERIFY_INTERVAL_S.

Exits 0 once the end marker is uploaded (at once if a previous run already finished), and on
SIGTERM/SIGINT (training is over, or the job is stopped) after following up to --drain seconds
more for the end marker and final passes that write the end marker itself if training wrote none;
2 on bad arguments; 1 when S3 kept failing past the give-up time (an endpoint that is full, HTTP 507
or a quota, is retried the same way and named: "S3 is full"). Before the end marker, and every
--verify-interval seconds, the destination is listed and whatever it lacks is sent again.
Its state (following, finishing, done, stopped, failed), last pass and counts are kept in the
status file (services/uploader/status.py), which the control API's reconciler reads. For people
reading its log it prints the same: a line once it follows the source, and last a JSON summary
(files, bytes, PUTs, re-sent files, upload lag percentiles), then on failure the error naming the
files that are not on S3.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from trainguard.services.uploader.status import final_record, ready_line
from trainguard.services.uploader.uploader import Uploader, UploaderError


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="python -m trainguard.services.uploader", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--source", default=env("UPLOADER_SOURCE"), help="local run directory to follow")
    parser.add_argument("--dest", default=env("UPLOADER_DEST"), help="s3://bucket/prefix")
    parser.add_argument("--endpoint-url", default=env("S3_ENDPOINT_URL"), help="S3-compatible endpoint")
    parser.add_argument(
        "--state-file", default=env("UPLOADER_STATE_FILE"), help="default <source>/.uploader-state.json"
    )
    parser.add_argument(
        "--status-file", default=env("UPLOADER_STATUS_FILE"),
        help="where the uploader keeps its status; default beside the state file (.uploader-status.json)",
    )
    parser.add_argument("--poll-interval", type=float, default=float(env("UPLOADER_POLL_INTERVAL", "0.5")))
    parser.add_argument("--drain", type=float, default=float(env("UPLOADER_DRAIN_S", "5")),
                        help="on SIGTERM, seconds to keep following for the end marker before the last pass")
    parser.add_argument("--give-up-after", type=float, default=float(env("UPLOADER_GIVE_UP_AFTER_S", "600")),
                        help="seconds of continuous S3 failure before exiting 1")
    parser.add_argument("--verify-interval", type=float, default=float(env("UPLOADER_VERIFY_INTERVAL_S", "10")),
                        help="seconds between listings of the destination that check what was sent is there")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="uploader: %(levelname)s %(message)s")
    args = _parser().parse_args(argv)
    for name, value in (("--source (or UPLOADER_SOURCE)", args.source), ("--dest (or UPLOADER_DEST)", args.dest)):
        if not value:
            print(f"uploader: {name} is required", file=sys.stderr)
            return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        uploader = Uploader(
            args.source, args.dest, endpoint_url=args.endpoint_url, state_file=args.state_file,
            poll_interval=args.poll_interval, give_up_after_s=args.give_up_after, drain_s=args.drain,
            stop_event=stop, verify_interval_s=args.verify_interval, status_file=args.status_file,
        )
    except UploaderError as error:
        print(f"uploader: {error}", file=sys.stderr)
        return 2
    print(ready_line(args.source, args.dest), flush=True)
    try:
        stats = uploader.run()
    except UploaderError as error:
        # The error goes last: the control API quotes the log's last line as the job's failure reason.
        print(final_record("failed", uploader.stats.summary()), flush=True)
        print(f"uploader: {error}", file=sys.stderr, flush=True)
        return 1
    print(final_record("stopped" if stop.is_set() else "done", stats.summary()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
