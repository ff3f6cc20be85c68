"""Extra ``trainguard`` verbs, one module each.

A module here defines ``register(subparsers) -> None``, which adds its parser and sets
``func=<callable(args) -> int>`` as its default; :mod:`trainguard.cli` picks it up. Keeping each
verb in its own module keeps ``cli.py`` small and lets a verb import heavy things lazily.
A module named ``_...`` is part of a verb, not a verb (``_rules_catalog``: ``rules list`` and
``rules describe``), and is not picked up.
"""
