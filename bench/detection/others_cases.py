"""The registry entries of the others_* programs: each family's healthy run and its fault twins,
the learning rate multiplied by 1e4 and the learning rate 0 (issue 43 item 10), plus the faults
of their own some families have (raw 0-255 pixels, a tanh-RNN word LM at the example's lr 20).

Labels follow faulty.py: a far too high learning rate is rightly diagnosed by the rules that
see its non-finite values, its oversized updates or its loss that does not fall; a learning
rate of 0 by the rules that see no updates or no learning. The DDP case is registered only
where ``torchrun`` can start two gloo ranks (``torch.distributed`` with gloo).
"""

from __future__ import annotations

from bench.detection.others_common import OthersSpec
from bench.detection.registry import FAULTY, HEALTHY, Case

LR_HIGH = ("ExplodingTensor", "WeightUpdateRatio", "LossNotDecreasing", "Underfitting")
NO_UPDATES = ("UnchangedTensor", "WeightUpdateRatio", "LossNotDecreasing")
RAW_PIXELS = ("CheckInputImages", "NotNormalizedData")
RISING_LOSS = ("LossNotDecreasing", "ExplodingTensor", "WeightUpdateRatio")


def _family(family: str, builder: object, spec: OthersSpec, what: str, healthy_symptom: str = "learns",
            high_symptom: str | None = "no_learning") -> list[Case]:  # fmt: skip
    """The healthy run and its lr x1e4 (unless ``high_symptom`` is None) and lr 0 twins."""
    name = family.replace("_", "-")
    high = OthersSpec(**{**spec.__dict__, "lr": spec.lr * 1e4})
    zero = OthersSpec(**{**spec.__dict__, "lr": 0.0})
    cases = [Case(f"healthy-{name}", family, HEALTHY, builder, spec, (), 0, healthy_symptom, what)]  # type: ignore[arg-type]
    if high_symptom is not None:
        cases.append(Case(f"fault-{name}-lr-x1e4", family, FAULTY, builder, high, LR_HIGH, 0, high_symptom,  # type: ignore[arg-type]
                          f"{what}, learning rate {high.lr:g} (x1e4)"))  # fmt: skip
    cases.append(Case(f"fault-{name}-lr-0", family, FAULTY, builder, zero, NO_UPDATES, 0, "frozen",  # type: ignore[arg-type]
                      f"{what}, learning rate 0"))  # fmt: skip
    return cases


def _ddp_possible() -> bool:
    import importlib.util
    import shutil

    if importlib.util.find_spec("torch") is None or shutil.which("torchrun") is None:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_gloo_available()


def others_cases() -> list[Case]:
    from bench.detection.others_generative import train_dcgan, train_siamese, train_vae
    from bench.detection.others_language import train_word_lm
    from bench.detection.others_misc import train_forward_forward, train_gcn, train_lbfgs_sine, train_polynomial
    from bench.detection.others_rl import train_actor_critic, train_reinforce
    from bench.detection.others_vision import train_cifar_resnet, train_mnist_cnn

    S = OthersSpec
    cases: list[Case] = []
    cases += _family("dcgan", train_dcgan, S("dcgan", lr=2e-4, steps=150, save_interval=5),
                     "DCGAN: N(0,0.02) init, BatchNorm, two Adam optimizers", "progress", "no_progress")  # fmt: skip
    cases += _family("vae", train_vae, S("vae", lr=1e-3, steps=150, save_interval=5), "VAE, BCE + KL, Adam")
    cases += _family("siamese", train_siamese, S("siamese", lr=1.0, steps=120, save_interval=5),
                     "siamese CNN on image pairs, BCELoss, Adadelta + StepLR")  # fmt: skip
    for variant, lr, steps in (("LSTM", 20.0, 200), ("GRU", 20.0, 200), ("RNN_TANH", 2.0, 200), ("Transformer", 5.0, 150)):
        cases += _family(f"word_lm_{variant.lower()}", train_word_lm,
                         S("word_lm", variant=variant, lr=lr, steps=steps, save_interval=5),
                         f"word-level LM ({variant}), hidden state fed back, hand-written SGD, clip 0.25")  # fmt: skip
    cases.append(
        Case("fault-word-lm-rnn-tanh-lr-20", "word_lm_rnn_tanh", FAULTY, train_word_lm,
             S("word_lm", variant="RNN_TANH", lr=20.0, steps=200, save_interval=5), RISING_LOSS, 0,
             "no_learning", "word-level tanh-RNN LM at the example's lr 20: the training loss rises")  # fmt: skip
    )
    cases += _family("lbfgs_sine", train_lbfgs_sine, S("lbfgs", lr=0.8, steps=10, save_interval=5),
                     "LBFGS, LSTMCells on sine waves, 10 steps of a closure")  # fmt: skip
    # On the windy ledge Adam at lr 100 (x1e4) does not learn: episodes last 0.50 -> 0.60 of the
    # 30 steps (REINFORCE), 0.50 -> 0.60 (actor-critic), against 0.75 -> 1.0 at lr 0.01 (no hook,
    # 400 episodes). On an earlier corridor world it still reached the goal: that world was replaced.
    cases += _family("reinforce", train_reinforce, S("reinforce", lr=1e-2, steps=400, save_interval=10),
                     "REINFORCE on an inline windy-ledge world", "progress", "no_progress")  # fmt: skip
    cases += _family("actor_critic", train_actor_critic, S("actor_critic", lr=1e-2, steps=400, save_interval=10),
                     "actor-critic on an inline windy-ledge world", "progress", "no_progress")  # fmt: skip
    cases += _family("gcn_kernel", train_gcn, S("gcn", lr=1e-2, steps=100, save_interval=5),
                     "graph convolution, bare nn.Parameter 'kernel', row-normalised features, val every epoch")
    cases += _family("forward_forward", train_forward_forward, S("forward_forward", lr=0.03, steps=120, save_interval=5),
                     "forward-forward net, layers trained one by one, layer.forward called directly")  # fmt: skip
    cases += _family("polynomial", train_polynomial, S("polynomial", lr=0.1, steps=300, save_interval=5),
                     "polynomial regression x..x^4, small init, hand-written SGD")  # fmt: skip
    cases += _family("cifar_resnet", train_cifar_resnet, S("cifar_resnet", lr=0.1, steps=60, save_interval=5),
                     "CIFAR-style ResNet, padded random crops then Normalize")  # fmt: skip
    cases += _family("mnist_unit_pixels", train_mnist_cnn, S("mnist", variant="unit", lr=1.0, steps=60, save_interval=2),
                     "MNIST-example CNN, pixels scaled to [0, 1] (ToTensor, no Normalize)")  # fmt: skip
    cases.append(
        Case("fault-mnist-raw-pixels", "mnist_unit_pixels", FAULTY, train_mnist_cnn,
             S("mnist", variant="raw", lr=1.0, steps=60, save_interval=2), RAW_PIXELS, 0, "by_construction",
             "MNIST-example CNN fed raw 0-255 pixel values")  # fmt: skip
    )
    if _ddp_possible():
        from bench.detection.others_ddp import train_ddp_gpt

        cases += _family("ddp_gpt", train_ddp_gpt, S("ddp_gpt", lr=3e-3, steps=80, save_interval=5),
                         "2-rank DDP (torchrun, gloo) GPT-like model, AdamW")  # fmt: skip
    return cases
