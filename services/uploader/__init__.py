"""Follows a job's local tensor directory and uploads it to S3 in an order readers can trust.

``python -m trainguard.services.uploader --source DIR --dest s3://bucket/prefix`` (see ``__main__``). Order per
round: event files and other finished files, collections, then each index whose event file is already
up (an S3 reader never sees an index pointing at a missing event file), and the end marker
``training_job_end.ts`` last, once everything else is up. Progress lives in a state file, replaced
atomically after each round (and at least every second); after a restart (even after kill -9) the
files it does not list yet are checked on S3 (HEAD: size and MD5) before any PUT, so nothing is
uploaded twice and nothing is lost.
"""

from trainguard.services.uploader.uploader import Uploader, UploaderError, UploadStats, parse_s3_url

__all__ = ["UploadStats", "Uploader", "UploaderError", "parse_s3_url"]
