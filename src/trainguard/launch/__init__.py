"""``trainguard run``: a training command started with zero-code capture. :mod:`.options` turns the
command line into the child's environment and hook config, checked before training starts;
:mod:`.supervise` runs and watches the training process. The parser is :mod:`trainguard.cli`'s."""

__all__: list[str] = []
