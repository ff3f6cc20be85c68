"""Which image runs a SageMaker job's ``TrainingImage``.

SageMaker SDK estimators name AWS's framework images (``763104351884.dkr.ecr.<region>.amazonaws.com/
pytorch-training:2.1-cpu-py310`` and the like). Those images live in AWS's registry, are tens of
GiB and cannot be pulled without AWS credentials; what they provide is Python, the framework and
the ``sagemaker-training`` toolkit, which trainguard's training image provides too. So AWS framework
images run as the configured training image, any other image (the user's own) runs as given, and
``TRAINGUARD_TRAINING_IMAGE_MAP`` (regex -> image, first match wins) overrides both.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["AWS_FRAMEWORK_IMAGE", "training_image_for"]

# AWS Deep Learning Containers and SageMaker's first-party framework images, in any region and
# partition (ECR hosts end in amazonaws.com or amazonaws.com.cn).
AWS_FRAMEWORK_IMAGE = re.compile(
    r"^\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(\.cn)?/"
    r"(pytorch|tensorflow|mxnet|huggingface-[a-z]+|sagemaker-xgboost|sagemaker-scikit-learn|"
    r"sagemaker-pytorch|sagemaker-tensorflow|autogluon|stabilityai-pytorch)[a-z0-9-]*(-training)?[:@]"
)


def training_image_for(requested: str | None, default_image: str, overrides: Sequence[tuple[str, str]] = ()) -> str:
    """The image that runs a job that asked for ``requested`` (None/'' -> ``default_image``)."""
    if not requested:
        return default_image
    for pattern, image in overrides:
        if re.search(pattern, requested):
            return image
    if AWS_FRAMEWORK_IMAGE.match(requested):
        return default_image
    return requested
