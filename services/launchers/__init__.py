"""Launchers start a job's processes: training, uploader, one rule runner per rule config.

One narrow interface (:class:`~trainguard.services.launchers.base.Launcher`), several back-ends: local
processes (the embedded default), Docker (the compose stack), later Kubernetes.
"""
