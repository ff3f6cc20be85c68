"""Bounds a job spec's values keep so that every later step can take them (exec, engines, files).

exec(2) takes one argument or ``NAME=value`` string of at most 128 KiB (MAX_ARG_STRLEN) and all of
them together within ARG_MAX (2 MiB here). The service adds variables of its own to a job's (the
hook and profiler configs, a rule's parameters and actions, as JSON), so each of those documents is
bounded too, and the whole fits. Each check raises ValueError with what was too large.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "MAX_COMMAND_BYTES",
    "MAX_DOCUMENT_BYTES",
    "MAX_ENVIRONMENT_BYTES",
    "MAX_EXEC_STRING_BYTES",
    "MIN_CPUS",
    "MIN_MEMORY_MB",
    "check_command",
    "check_document_size",
    "check_environment",
    "nesting_problem",
]

MAX_EXEC_STRING_BYTES = 128 * 1024
MAX_ENVIRONMENT_BYTES = 512 * 1024
MAX_COMMAND_BYTES = 256 * 1024
MAX_DOCUMENT_BYTES = 64 * 1024  # a hook or profiler config, a rule's parameters or actions, as JSON
MIN_CPUS = 0.01  # the smallest CPU limit an engine grants (docker: --cpus 0.01)
MIN_MEMORY_MB = 6  # the smallest memory limit docker accepts
# Python's regex parser recurses once per nested group: about 450 levels fail in a fresh process
# (the job's hook, the rule runner), and fewer or more in the API depending on its stack and its
# recursion limit (torch.compile raises it). A fixed bound gives one answer everywhere.
MAX_NESTING = 100


def _exec_bytes(text: str, extra: int = 0) -> int:
    """Bytes of ``text`` as exec(2) gets it (UTF-8 and its NUL), ``extra`` bytes beside it (``NAME=``)."""
    return len(text.encode("utf-8", errors="surrogatepass")) + extra + 1


def check_document_size(value: Any, what: str) -> None:
    """A document passed to a process as JSON text in one variable."""
    size = len(json.dumps(value, default=str))
    if size > MAX_DOCUMENT_BYTES:
        raise ValueError(f"{what} is {size} bytes as JSON; at most {MAX_DOCUMENT_BYTES} bytes are passed to a job")


def check_command(arguments: Sequence[str]) -> None:
    for index, argument in enumerate(arguments):
        if _exec_bytes(argument) > MAX_EXEC_STRING_BYTES:
            raise ValueError(f"argument {index} is over {MAX_EXEC_STRING_BYTES} bytes (UTF-8), what exec(2) takes")
    total = sum(_exec_bytes(argument) for argument in arguments)
    if total > MAX_COMMAND_BYTES:
        raise ValueError(f"the arguments take {total} bytes; at most {MAX_COMMAND_BYTES} together")


def check_environment(environment: Mapping[str, str]) -> None:
    from trainguard.services.sagemaker_container.contract import CONTRACT_ENV

    for key, item in environment.items():
        size = _exec_bytes(item, len(key) + 1)
        if key == CONTRACT_ENV and size > MAX_EXEC_STRING_BYTES:
            raise ValueError(  # what a SageMaker request makes of its members, passed as one variable
                f"HyperParameters: with the channels and settings, the job's SageMaker container contract is "
                f"{size} bytes; at most {MAX_EXEC_STRING_BYTES} pass to a job (shorten the values)"
            )
        if size > MAX_EXEC_STRING_BYTES:
            raise ValueError(
                f"{key}: '{key}=value' is over {MAX_EXEC_STRING_BYTES} bytes (UTF-8), the most exec(2) takes for "
                "one variable"
            )
    total = sum(_exec_bytes(item, len(key) + 1) for key, item in environment.items())
    if total > MAX_ENVIRONMENT_BYTES:
        raise ValueError(f"the variables take {total} bytes; at most {MAX_ENVIRONMENT_BYTES} together")


def nesting_problem(text: str) -> str:
    """Why ``text`` (a regex, or any value a rule may compile as one) nests too deeply ("" when
    it does not): more than :data:`MAX_NESTING` parentheses open at once (escaped ones aside)."""
    depth = deepest = 0
    escaped = False
    for character in text:
        if escaped:
            escaped = False
        elif character == "\\":
            escaped = True
        elif character == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif character == ")":
            depth = max(0, depth - 1)
    return f"nests {deepest} groups; at most {MAX_NESTING}" if deepest > MAX_NESTING else ""
