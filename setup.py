"""Package layout only (metadata lives in pyproject.toml).

The repository keeps the service code at the top level (``services/``) while the core library is in
``src/trainguard``. Both ship in one wheel: ``services`` is installed as ``trainguard.services`` so
``pip install 'trainguard[service]'`` gives ``trainguard serve`` and ``python -m
trainguard.services.api``. The package list is computed so a new sub-package needs no edit here.
"""

from setuptools import find_packages, setup

core_packages = find_packages("src")
service_packages = ["trainguard.services"] + [f"trainguard.services.{name}" for name in find_packages("services")]

setup(
    packages=core_packages + service_packages,
    package_dir={"": "src", "trainguard.services": "services"},
)
