"""The rule-runner process: ``python -m trainguard.services.rule_runner`` (configured by environment).

Runs trainguard's RuleRunner on one rule configuration of one job (or, with
TRAINGUARD_RULE_GROUP_JSON, on every rule of one job in one process: how the Ray launcher runs
them), reports every status transition and finding to the control API at once and the per-step
datapoints in batches (RULE_REPORT_BATCH_S, 5 s), and emits CloudWatch-style metrics:

* namespace ``trainguard/Rules``, dimensions ``TrainingJobName`` and ``RuleConfigurationName``;
* ``RuleIssuesFound``: 1 when an evaluated step met the rule's condition, else 0 (Count);
* ``RuleLastEvaluatedStep``: the global step just evaluated (None unit).

Exit codes: 0 NoIssuesFound, 1 IssuesFound, 2 Error (bad configuration or crash), 143 stopped; a
group prints each rule's as ``trainguard rule group: rule:<name> exit <code>`` and exits with the
worst.
"""
