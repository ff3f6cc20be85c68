"""Every error class the service defines is a ``ServiceError``, so a ``TrainguardError`` (one
hierarchy with the library's), and keeps the standard exception it derived from before (the
routes' ``except KeyError`` / ``except ValueError`` and their HTTP mapping are unchanged)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import trainguard.services as services
from trainguard.errors import TrainguardError
from trainguard.services.errors import ServiceError


def _service_error_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module_info in pkgutil.walk_packages(services.__path__, services.__name__ + "."):
        if module_info.name.rsplit(".", 1)[-1] == "__main__":
            continue  # entry points: nothing defined there is raised elsewhere
        try:
            module = importlib.import_module(module_info.name)
        except ImportError as error:  # an optional back-end (ray) that is not installed here
            if error.name and error.name.split(".")[0] != "trainguard":
                continue
            raise
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = value
    return found


def test_every_service_error_is_a_service_error_and_a_trainguard_error() -> None:
    classes = _service_error_classes()
    assert len(classes) >= 12  # the API's, the launchers', the job side's, the uploader's, the proxy's
    outside = sorted(name for name, cls in classes.items() if not issubclass(cls, ServiceError))
    assert outside == []
    assert issubclass(ServiceError, TrainguardError)


@pytest.mark.parametrize(
    ("path", "standard"),
    [
        ("api.jobs.JobNotFound", KeyError),
        ("api.jobs.JobExists", ValueError),
        ("api.jobs.JobForbidden", PermissionError),
        ("api.policy.PolicyError", ValueError),
        ("api.sagemaker_validation.RequestInvalid", ValueError),
        ("launchers.base.LauncherError", RuntimeError),
        ("sagemaker_container.contract.ContractError", ValueError),
        ("sagemaker_container.channels.ChannelError", RuntimeError),
        ("actions.pinned_http.DeliveryError", OSError),
        ("actions.outbound_policy.OutboundRefused", ValueError),
        ("uploader.uploader.UploaderError", RuntimeError),
    ],
)
def test_each_keeps_its_standard_base(path: str, standard: type[BaseException]) -> None:
    module, name = path.rsplit(".", 1)
    cls = getattr(importlib.import_module(f"trainguard.services.{module}"), name)
    assert issubclass(cls, standard) and issubclass(cls, ServiceError)


def test_messages_read_as_before() -> None:
    from trainguard.services.api.jobs import JobNotFound
    from trainguard.services.api.sagemaker import SageMakerError

    assert str(JobNotFound("job-1")) == "'job-1'"  # KeyError's own rendering
    error = SageMakerError("ValidationException", "bad name", 400)
    assert (str(error), error.code, error.status) == ("bad name", "ValidationException", 400)
