"""Policy-gradient (REINFORCE) and actor-critic agents as the public reinforcement-learning
examples write them (a policy network called once per environment step, log-probabilities kept
for the episode, normalised discounted returns, one optimizer step per episode), on a tiny
environment written here instead of gym.

An agent's loss is not what improves when it learns (REINFORCE's loss is a return-weighted
log-probability whose scale changes with the returns), so the label is checked on the episode
returns (``progress``; registry.verify): a run learns when its last episodes last on average
``progress_goal`` (0.85) of the 30 steps; a uniformly random policy lasts 0.26 of them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.detection.others_common import Capture, OthersSpec, freeze_all

CELLS, MAX_STEPS, GAMMA = 9, 30, 0.99


class LineWorld:
    """A ledge of ``CELLS`` cells with a wind that pushes right at 7 steps in 10 on average: the
    agent (its cell one-hot) steps left or right and earns 1 per step until it falls off an end
    or ``MAX_STEPS`` pass, so, as in CartPole, a good policy is a long episode (and the
    examples' per-episode normalised returns carry the signal). A random policy falls off after
    a quarter of the steps; leaning against the wind lasts them all."""

    observation_size, actions = CELLS, 2

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.position, self.steps = CELLS // 2, 0

    def _observation(self) -> np.ndarray:
        observation = np.zeros(self.observation_size, dtype=np.float32)
        observation[self.position] = 1.0
        return observation

    def reset(self) -> np.ndarray:
        self.position, self.steps = CELLS // 2, 0
        return self._observation()

    def step(self, action: int) -> tuple[np.ndarray, float, bool]:
        self.position += (1 if action == 1 else -1) + int(self.rng.random() < 0.7)
        self.steps += 1
        if not 0 <= self.position < CELLS:
            return np.zeros(self.observation_size, dtype=np.float32), 1.0, True
        return self._observation(), 1.0, self.steps >= MAX_STEPS


def _discounted(rewards: list[float]) -> Any:
    import torch

    returns, R = [], 0.0
    for r in reversed(rewards):
        R = r + GAMMA * R
        returns.insert(0, R)
    return torch.tensor(returns)


def train_reinforce(out_dir: str, spec: OthersSpec) -> str:
    import torch
    from torch import nn
    from torch.distributions import Categorical

    torch.manual_seed(spec.seed)

    class Policy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.affine1 = nn.Linear(LineWorld.observation_size, 64)
            self.dropout = nn.Dropout(p=0.2)
            self.affine2 = nn.Linear(64, LineWorld.actions)
            self.saved_log_probs: list[Any] = []
            self.rewards: list[float] = []

        def forward(self, x):  # type: ignore[no-untyped-def]
            x = self.affine1(x)
            x = self.dropout(x)
            return torch.softmax(self.affine2(torch.relu(x)), dim=1)

    policy = Policy()
    if spec.freeze:
        freeze_all([policy])
    optimizer = torch.optim.Adam(policy.parameters(), lr=spec.lr)
    eps = np.finfo(np.float32).eps.item()
    env = LineWorld(spec.seed)
    capture = Capture(out_dir, spec)
    capture.start([policy])
    episode_returns: list[float] = []
    try:
        for _ in range(spec.steps):  # one optimizer step per episode
            state, done = env.reset(), False
            while not done:
                probs = policy(torch.from_numpy(state).unsqueeze(0))
                m = Categorical(probs)
                action = m.sample()
                policy.saved_log_probs.append(m.log_prob(action))
                state, reward, done = env.step(int(action.item()))
                policy.rewards.append(reward)
            returns = _discounted(policy.rewards)
            returns = (returns - returns.mean()) / (returns.std() + eps)
            policy_loss = torch.cat([-log_prob * R for log_prob, R in zip(policy.saved_log_probs, returns)]).sum()
            optimizer.zero_grad()
            policy_loss.backward()
            optimizer.step()
            episode_returns.append(float(sum(policy.rewards)) / MAX_STEPS)
            capture.losses.append(float(policy_loss.item()))
            del policy.rewards[:], policy.saved_log_probs[:]
    except ValueError as error:  # Categorical refuses NaN probabilities: the script dies here
        capture.losses.append(float("nan"))
        capture.extra["crashed"] = str(error)[:200]
    finally:
        capture.extra.update(progress=episode_returns, progress_goal=0.85, progress_text="episode length / 30")
        out = capture.finish()
    return out


def train_actor_critic(out_dir: str, spec: OthersSpec) -> str:
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.distributions import Categorical

    torch.manual_seed(spec.seed)

    class Policy(nn.Module):
        """Actor and critic in one model: a shared layer, an action head and a value head."""

        def __init__(self) -> None:
            super().__init__()
            self.affine1 = nn.Linear(LineWorld.observation_size, 64)
            self.action_head = nn.Linear(64, LineWorld.actions)
            self.value_head = nn.Linear(64, 1)
            self.saved_actions: list[tuple[Any, Any]] = []
            self.rewards: list[float] = []

        def forward(self, x):  # type: ignore[no-untyped-def]
            x = F.relu(self.affine1(x))
            return F.softmax(self.action_head(x), dim=-1), self.value_head(x)

    model = Policy()
    if spec.freeze:
        freeze_all([model])
    optimizer = torch.optim.Adam(model.parameters(), lr=spec.lr)
    eps = np.finfo(np.float32).eps.item()
    env = LineWorld(spec.seed)
    capture = Capture(out_dir, spec)
    capture.start([model])
    episode_returns: list[float] = []
    try:
        for _ in range(spec.steps):
            state, done = env.reset(), False
            while not done:
                probs, state_value = model(torch.from_numpy(state).float())
                m = Categorical(probs)
                action = m.sample()
                model.saved_actions.append((m.log_prob(action), state_value))
                state, reward, done = env.step(int(action.item()))
                model.rewards.append(reward)
            returns = _discounted(model.rewards)
            returns = (returns - returns.mean()) / (returns.std() + eps)
            policy_losses, value_losses = [], []
            for (log_prob, value), R in zip(model.saved_actions, returns):
                advantage = R - value.item()
                policy_losses.append(-log_prob * advantage)
                value_losses.append(F.smooth_l1_loss(value, torch.tensor([R])))
            optimizer.zero_grad()
            loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()
            loss.backward()
            optimizer.step()
            episode_returns.append(float(sum(model.rewards)) / MAX_STEPS)
            capture.losses.append(float(loss.item()))
            del model.rewards[:], model.saved_actions[:]
    except ValueError as error:  # Categorical refuses NaN probabilities: the script dies here
        capture.losses.append(float("nan"))
        capture.extra["crashed"] = str(error)[:200]
    finally:
        capture.extra.update(progress=episode_returns, progress_goal=0.85, progress_text="episode length / 30")
        out = capture.finish()
    return out
