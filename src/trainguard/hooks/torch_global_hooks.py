"""Global module hooks (``register_module_forward_*``) without torch.compile's warning about them.

``OptimizedModule.__call__`` (recent torch; 2.13 here) warns, whenever a global module hook
exists, that the hook "will fire an extra time" for the wrapper. Every global hook of ours expects
that call and passes it by (``is_compile_wrapper``), so the warning would only tell a ``trainguard
run`` user, who changed no code, that something is wrong when nothing is; under
``-W error`` it would even raise in their training loop. Our global hooks are registered through
these functions, which first make sure an "ignore" filter for exactly that message comes before
any other filter that could apply to it. The filter list is only changed when it has to be: each
change makes Python forget which warnings it already showed once. A script's own global hooks lose
that warning while the filter is in place; the filter names the message and category only.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

from torch.nn.modules import module as torch_module

__all__ = ["register_global_forward_hook", "register_global_forward_pre_hook"]

_TEXT = "Using `torch.compile(module)` when there are global hooks on modules"
_MESSAGE = re.escape(_TEXT)
_PATTERN = re.compile(_MESSAGE, re.IGNORECASE)  # how warnings.filterwarnings stores it


def _filter_compile_warning() -> None:
    for action, message, category, module, _lineno in warnings.filters:
        if action == "ignore" and message == _PATTERN and category is UserWarning and module is None:
            return  # ours, ahead of anything else that applies
        applies = message is None or not hasattr(message, "match") or message.match(_TEXT)
        if applies and issubclass(UserWarning, category):
            break  # another filter would decide first (simplefilter("error"), "always", ...)
    warnings.filterwarnings("ignore", message=_MESSAGE, category=UserWarning)


def register_global_forward_pre_hook(hook: Callable[..., Any]) -> Any:
    _filter_compile_warning()
    return torch_module.register_module_forward_pre_hook(hook)


def register_global_forward_hook(hook: Callable[..., Any], *, always_call: bool = False) -> Any:
    _filter_compile_warning()
    return torch_module.register_module_forward_hook(hook, always_call=always_call)
