"""LossNotDecreasing's fix hints, per kind of finding and framework."""

from __future__ import annotations

__all__ = ["ABOVE_CHANCE_HINT", "ABOVE_CHANCE_HINTS", "DIVERGING_HINT", "DIVERGING_HINTS", "PLATEAU_HINT",
           "PLATEAU_HINTS"]

DIVERGING_HINTS = {
    "pytorch": "the loss is rising: lower the learning rate (or warm it up with torch.optim.lr_scheduler), clip "
    "gradients (torch.nn.utils.clip_grad_norm_), and check the loss gets the model's raw outputs",
    "keras": "the loss is rising: lower the optimizer's learning_rate (or use a LearningRateSchedule), clip "
    "gradients with the optimizer's clipnorm= argument, and check from_logits matches the model's last layer",
    "xgboost": "the training metric is rising: lower eta (learning_rate), reduce max_depth, raise "
    "min_child_weight, and check the objective matches the labels",
}
DIVERGING_HINT = (
    "the loss is rising: lower the learning rate or use a scheduler, clip gradients, and check the loss "
    "gets the model's raw outputs"
)
PLATEAU_HINTS = {
    "pytorch": "the loss is not falling: raise the learning rate, check that the optimizer receives "
    "model.parameters() (and that optimizer.step() runs), that labels match their inputs and that "
    "CrossEntropyLoss gets raw logits",
    "keras": "the loss is not falling: raise the optimizer's learning_rate, check that the layers are "
    "trainable, that labels match their inputs and that from_logits matches the model's last layer",
    "xgboost": "the training metric is not falling: raise eta (learning_rate) or max_depth, check that "
    "num_boost_round is more than a few rounds and that labels match their rows",
}
PLATEAU_HINT = (
    "the loss is flat: if it never dropped, raise the learning rate, check that the optimizer "
    "receives model.parameters() and that labels match their inputs; if it flattened after "
    "progress, training has converged: stop early or decay the learning rate"
)

ABOVE_CHANCE_HINT = (
    "the loss is far above a uniform guess's: the logits are far too large; check the initialisation "
    "(weights far above 1/sqrt(fan-in), recurrent weights included), the input scale and the learning rate"
)
ABOVE_CHANCE_HINTS = {
    "pytorch": "the loss is far above a uniform guess's: the logits are far too large; check the initialisation "
    "(nn.init.xavier_uniform_/kaiming_normal_; recurrent weight_hh of std about 1/sqrt(hidden)), the input scale "
    "and the learning rate, or clip gradients (torch.nn.utils.clip_grad_norm_)",
}
