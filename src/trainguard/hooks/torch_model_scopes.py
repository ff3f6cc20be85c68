"""Which model a module tensor belongs to, when a process trains several (a GAN's generator and
discriminator, an actor and a critic).

Module tensors are named by the module's path inside its root (``main.2_output_0``), as smdebug
names them; two roots with the same child paths (a tutorial DCGAN's ``Generator.main`` and
``Discriminator.main``) would write one tensor name for two different layers. A later root whose
top-level child names clash with an earlier root's gets its own name as a prefix
(``Discriminator.main.2_output_0``), so the first component of a module tensor's name tells its
model. The first root keeps smdebug's names.

The collections file's ``_meta`` says which first components belong to which root
(``model_scopes``), for rules that judge each model on its own (PoorWeightInitialization compares
the layers of one model, never a generator's with a discriminator's).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ModelScopes"]


class ModelScopes:
    """The first name components of each root's module tensors."""

    def __init__(self) -> None:
        self._heads: dict[str, set[str]] = {}  # root name -> first components of its module names

    @staticmethod
    def unique_root_name(class_name: str, taken: set[str]) -> str:
        """A root's name: its class name, numbered from ``_1`` when another root holds it."""
        if class_name not in taken:
            return class_name
        index = 1
        while f"{class_name}_{index}" in taken:
            index += 1
        return f"{class_name}_{index}"

    def prefix(self, root_name: str, module: Any) -> str:
        """The prefix ("" or ``<root>.``) for the child names of ``module``, a new root."""
        heads = {name.split(".", 1)[0] for name, _ in module.named_modules() if name}
        taken = set(self._heads).union(*self._heads.values())
        clash = bool(heads & taken) or root_name in taken
        self._heads[root_name] = {root_name} if clash else {root_name, *heads}
        return f"{root_name}." if clash else ""

    def facts(self) -> dict[str, object]:
        """``{"model_scopes": {root: [first components]}}`` when there are several roots."""
        if len(self._heads) < 2:
            return {}
        return {"model_scopes": {root: sorted(heads) for root, heads in self._heads.items()}}
