"""SageMaker's training-container contract, on any launcher.

A SageMaker training job (from the SageMaker Python SDK or boto3) expects the platform to lay out
``/opt/ml`` for its container, fetch its data channels, run its code and collect its outputs. This
package does that job-side, inside the training process's environment (a local process with a
per-job ``opt/ml`` directory, or a container at ``/opt/ml``):

1. :mod:`.contract`: the job's contract (hyperparameters, channels, output path, hosts...) as the
   API derives it from ``CreateTrainingJob``, and the ``input/config/*.json`` files it becomes;
2. :mod:`.channels`: ``InputDataConfig`` channels from S3 into ``input/data/<channel>``;
3. :mod:`.__main__`: runs the training: the framework path (``sagemaker_program`` and
   ``sagemaker_submit_directory``) through the ``sagemaker-training`` toolkit, as SageMaker's
   framework containers do, or the job's own entry point;
4. :mod:`.outputs`: ``model/`` -> ``model.tar.gz`` and ``output/data/`` -> ``output.tar.gz`` at
   ``<S3OutputPath>/<job>/output/``, and ``output/failure`` -> the job's ``FailureReason``.
"""

from trainguard.services.sagemaker_container.contract import JobContract, contract_from_request

__all__ = ["JobContract", "contract_from_request"]
