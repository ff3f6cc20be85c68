"""Integrations with hyperparameter-sweep engines: stop a trial when trainguard's rules find an issue.

* :mod:`trainguard.integrations.live`: :class:`LiveRuleMonitor`, the rules following one trial's
  capture while it trains (no third-party dependency);
* :mod:`trainguard.integrations.tune`: Ray Tune (``pip install 'trainguard[tune]'``);
* :mod:`trainguard.integrations.optuna`: Optuna (``pip install 'trainguard[optuna]'``).

Nothing here is imported by ``import trainguard``, and Ray / Optuna are imported only by the
module that needs them.
"""
