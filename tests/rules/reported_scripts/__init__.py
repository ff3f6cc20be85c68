"""Training scripts of the cases users reported (issue 11), run by tests/rules/test_reported_runs.py."""
