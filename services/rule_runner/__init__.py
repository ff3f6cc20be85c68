"""The rule-runner process: ``python -m trainguard.services.rule_runner`` (configured by environment).

Runs trainguard's RuleRunner on one rule configuration of one job, reports every status
transition to the control API, and emits CloudWatch-style metrics:

* namespace ``trainguard/Rules``, dimensions ``TrainingJobName`` and ``RuleConfigurationName``;
* ``RuleIssuesFound``: 1 when an evaluated step met the rule's condition, else 0 (Count);
* ``RuleLastEvaluatedStep``: the global step just evaluated (None unit).

Exit codes: 0 NoIssuesFound, 1 IssuesFound, 2 Error (bad configuration or crash), 143 stopped.
"""
