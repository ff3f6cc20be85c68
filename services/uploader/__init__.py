"""Follows a job's local tensor directory and uploads it to S3 in an order readers can trust.

``python -m trainguard.services.uploader --source DIR --dest s3://bucket/prefix`` (see ``__main__``). Order per
round: event files and other finished files, collections, then each index whose event file is already
up (an S3 reader never sees an index pointing at a missing event file), and the end marker
``training_job_end.ts`` last, once everything else is up. Progress lives in a state file, replaced
atomically after each round (and at least every second); after a restart (even after kill -9) the
files it does not list yet are checked on S3 (HEAD: size and MD5) before any PUT, so nothing is
uploaded twice and nothing is lost.

What the state says is on S3 is checked against a listing of the destination every
``--verify-interval`` seconds and always before the end marker: a file the endpoint lost (restarted
empty, bucket deleted; the bucket is created again) is sent again, so the end marker never stands
over missing files. On SIGTERM (training is over, or the job is stopped) it drains, makes its final
passes and writes the end marker itself if training wrote none (a run that captured nothing still
ends). A full endpoint (HTTP 507 StorageFull, or a quota) is retried like any S3 failure and logged as
"S3 is full". When S3 keeps failing past the give-up time it exits 1 naming the files not on S3; the control
API restarts an uploader that died otherwise (see ``trainguard.services.api.reconciler``).

What it is doing (following, finishing, done, stopped, failed), its last pass and its counts are in
a status file beside the state file (``.uploader-status.json``, see ``status``): that, not its log,
is what the control API reads to supervise it.
"""

from trainguard.services.uploader.uploader import Uploader, UploaderError, UploadStats, parse_s3_url

__all__ = ["UploadStats", "Uploader", "UploaderError", "parse_s3_url"]
