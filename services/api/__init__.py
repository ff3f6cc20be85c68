"""trainguard's control API: native REST under /v1, SageMaker-compatible awsJson 1.1 on POST /.

Run it with ``python -m trainguard.services.api`` (settings from the environment: trainguard.services.api.settings).
"""
