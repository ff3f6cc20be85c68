"""CloudWatch-style alarms evaluated by trainguard itself (moto's CloudWatch stores alarms but
never evaluates them).

An alarm watches one metric of a job's rules (``RuleIssuesFound`` by default, optionally one rule
configuration) and is in ``ALARM`` when at least N (``datapoints_to_alarm``) of the latest M
(``evaluation_periods``) datapoints breach the threshold under the comparison. Each datapoint a
rule runner reports is one evaluation period: rules evaluate per step, not per minute.
Actions run once, on the transition into ``ALARM``.
"""

from trainguard.services.alarms.evaluate import AlarmSpec, AlarmState, breaches, evaluate_alarm, implicit_rule_alarm

__all__ = ["AlarmSpec", "AlarmState", "breaches", "evaluate_alarm", "implicit_rule_alarm"]
