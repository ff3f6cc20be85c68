"""trainguard's one exception hierarchy.

::

    TrainguardError
    ├── ConfigError                  bad hook/trial configuration; raised before training starts
    ├── StorageError                 a store could not be read or written (after retries)
    │   └── ObjectNotFound           the key does not exist in the store
    ├── MissingDependencyError       an optional extra (torch, boto3, ...) is not installed
    ├── FormatError                  a corrupt or truncated file; names the file and the offset
    └── TrialError                   something a reader asked for is not there (yet)
        ├── TensorUnavailable             no tensor of that name in the run
        ├── TensorUnavailableForStep      the tensor exists, but not at that step/mode/worker
        ├── StepUnavailable               the step will never exist (training ended without it)
        ├── StepNotYetAvailable           the step may still come: the run is live
        ├── NoMoreData                    the run has ended and the requested step is past its end
        ├── MissingCollectionFiles        the run has no collections file (yet)
        ├── InvalidWorker                 no such worker in the run
        └── WaitTimeout                   wait_for_steps gave up after its timeout

The names of the trial errors match smdebug's so that code catching them keeps working.
Every message says what was asked for, what was found instead, and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "ChecksumMissing",
    "ConfigError",
    "FormatError",
    "InvalidWorker",
    "MissingCollectionFiles",
    "MissingDependencyError",
    "NoMoreData",
    "ObjectNotFound",
    "StepNotYetAvailable",
    "StepUnavailable",
    "StorageError",
    "TensorUnavailable",
    "TensorUnavailableForStep",
    "TrainguardError",
    "TrialError",
    "WaitTimeout",
]


class TrainguardError(Exception):
    """Base class of every error trainguard raises on purpose."""


class ConfigError(TrainguardError, ValueError):
    """A configuration value is invalid. The message names the value and the fix."""


class StorageError(TrainguardError, OSError):
    """Reading or writing a store failed."""


class ObjectNotFound(StorageError, FileNotFoundError):
    """The requested key does not exist in the store."""


class MissingDependencyError(TrainguardError, ImportError):
    """An optional dependency is needed for what was asked."""

    def __init__(self, package: str, extra: str, purpose: str) -> None:
        super().__init__(f"{purpose} needs {package}: pip install 'trainguard[{extra}]'")
        self.package = package
        self.extra = extra


class FormatError(TrainguardError):
    """A file is corrupt or truncated."""

    def __init__(self, path: str, offset: int, problem: str) -> None:
        super().__init__(f"{path} at byte {offset}: {problem}")
        self.path = path
        self.offset = offset
        self.problem = problem


class ChecksumMissing(FormatError):
    """A record has no payload checksum in its index although the run's writer checksums every
    payload: the index was altered or damaged, so the value cannot be trusted."""


class TrialError(TrainguardError):
    """Something a trial reader asked for is not available."""


class TensorUnavailable(TrialError, KeyError):
    """No tensor of this name was saved in the run."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class TensorUnavailableForStep(TrialError):
    """The tensor exists in the run, but not for the requested step/mode/worker."""

    def __init__(self, message: str, *, has_reductions: bool = False) -> None:
        super().__init__(message)
        self.has_reductions = has_reductions


class StepUnavailable(TrialError):
    """The step does not exist and never will (training ended, or a later step is complete)."""


class StepNotYetAvailable(TrialError):
    """The step is not written yet; the run is still live."""


class NoMoreData(TrialError):
    """Training has ended and the requested step lies past the last one written."""


class MissingCollectionFiles(TrialError):
    """The run directory has no collections file, so it is not (yet) a trainguard/smdebug run."""


class InvalidWorker(TrialError):
    """The requested worker did not write anything in this run."""


class WaitTimeout(TrialError, TimeoutError):
    """A wait for steps ended at its timeout."""
