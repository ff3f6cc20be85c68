"""The service's errors, under trainguard's one hierarchy (:mod:`trainguard.errors`).

::

    TrainguardError
    └── ServiceError                     an error of the service (API, launchers, job side, uploader)
        ├── JobNotFound (KeyError)            api/jobs.py: HTTP 404 / ResourceNotFound
        ├── JobExists (ValueError)            api/jobs.py: HTTP 409 / ResourceInUse
        ├── JobForbidden (PermissionError)    api/jobs.py: HTTP 403
        ├── NameTaken                         api/job_creation.py: a job name claimed by another request
        ├── PolicyError (ValueError)          api/policy.py: a tenancy policy that does not hold
        ├── RequestInvalid (ValueError)       api/sagemaker_validation.py: ValidationException
        ├── SageMakerError                    api/sagemaker.py: an awsJson error (code, status)
        ├── SigV4Error                        api/auth.py: a signature that does not hold
        ├── LauncherError (RuntimeError)      launchers/base.py: the back-end failed
        │   └── LaunchRefused                     the back-end refused the request (a client error)
        ├── ContractError (ValueError)        sagemaker_container/contract.py: SageMaker's job contract
        ├── ChannelError (RuntimeError)       sagemaker_container/channels.py: an input channel
        ├── DeliveryError (OSError)           actions/pinned_http.py: a webhook not delivered
        ├── OutboundRefused (ValueError)      actions/outbound_policy.py: a destination not allowed
        ├── Refused                           docker_proxy/refusals.py: a Docker API call refused
        └── UploaderError (RuntimeError)      uploader/uploader.py: S3 refused or unreachable

Each keeps the standard exception it derived from before (in brackets), so code that catches
``KeyError`` or ``ValueError`` keeps working; the HTTP status each maps to is decided where it is
caught (the routes), not here. The core library never imports this module.
"""

from __future__ import annotations

from trainguard.errors import TrainguardError

__all__ = ["ServiceError"]


class ServiceError(TrainguardError):
    """Base class of every error the service raises on purpose."""
