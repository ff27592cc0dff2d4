"""REINFORCE with an autoregressive policy (Zoph & Le 2017): an LSTM, or a causal
Transformer over the same decision sequence."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, cast

import numpy as np
import torch
import torch.nn as nn

from autosearch.architecture import Architecture, Gene
from autosearch.controller import Controller, Outcome, unseen_architecture
from autosearch.errors import ConfigError
from autosearch.registry import register_controller
from autosearch.space import SearchSpace
from controllers._tensors import decode, encode
from controllers._walk import Walker

__all__ = ["Reinforce"]


class _Policy(nn.Module):
    """An LSTM that emits the space's decisions one after another, each conditioned on
    the ones before it through the embedding of the previous choice."""

    def __init__(self, sizes: list[int], hidden: int) -> None:
        super().__init__()
        self.start = nn.Parameter(torch.zeros(1, hidden))
        self.cell = nn.LSTMCell(hidden, hidden)
        self.embeddings = nn.ModuleList(nn.Embedding(n, hidden) for n in sizes)
        self.heads = nn.ModuleList(nn.Linear(hidden, n) for n in sizes)

    def sample(self, n: int, generator: torch.Generator, temperature: float) -> list[list[int]]:
        """``n`` decision sequences, drawn side by side."""
        x = self.start.expand(n, -1)
        state = None
        taken = []
        for head, embed in zip(self.heads, self.embeddings, strict=True):
            state = self.cell(x, state)
            probs = torch.softmax(head(state[0]) / temperature, dim=-1)
            choice = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            taken.append(choice)
            x = embed(choice)
        return torch.stack(taken, dim=1).tolist()

    def score(
        self, choices: list[list[int]], temperature: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability and entropy of each given decision sequence (one pass)."""
        given = torch.tensor(choices)
        x = self.start.expand(len(choices), -1)
        state = None
        log_prob = entropy = torch.zeros(len(choices))
        for index, (head, embed) in enumerate(zip(self.heads, self.embeddings, strict=True)):
            state = self.cell(x, state)
            logp = torch.log_softmax(head(state[0]) / temperature, dim=-1)
            log_prob = log_prob + logp.gather(1, given[:, index : index + 1]).squeeze(1)
            entropy = entropy - (logp.exp() * logp).sum(dim=1)
            x = embed(given[:, index])
        return log_prob, entropy


class _TransformerPolicy(nn.Module):
    """A causal Transformer that emits the space's decisions one after another: the
    token at step ``i`` is the embedding of decision ``i - 1`` (a learnt start token at
    step 0) plus a learnt position; decision ``i`` is read from step ``i``'s output, which
    attends to steps ``0 .. i`` only. Scoring given choices is one masked pass."""

    def __init__(self, sizes: list[int], hidden: int, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        if hidden % heads:
            raise ConfigError(
                f"the transformer policy needs hidden divisible by {heads}, got {hidden}"
            )
        self.start = nn.Parameter(torch.zeros(1, hidden))
        self.position = nn.Parameter(torch.randn(len(sizes), hidden) * 0.02)
        self.embeddings = nn.ModuleList(nn.Embedding(n, hidden) for n in sizes)
        self.heads = nn.ModuleList(nn.Linear(hidden, n) for n in sizes)
        layer = nn.TransformerEncoderLayer(
            hidden, heads, dim_feedforward=2 * hidden, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        mask = nn.Transformer.generate_square_subsequent_mask(len(sizes))
        self.register_buffer("mask", mask, persistent=False)

    def _output(self, previous: torch.Tensor) -> torch.Tensor:
        """The outputs of steps ``0 .. k`` given ``k`` previous decisions (batch, k)."""
        batch, k = previous.shape
        tokens = [self.start.expand(batch, -1)]
        tokens += [self.embeddings[i](previous[:, i]) for i in range(k)]
        x = torch.stack(tokens, dim=1) + self.position[: k + 1]
        mask = cast(torch.Tensor, self.mask)[: k + 1, : k + 1]
        return cast(torch.Tensor, self.encoder(x, mask=mask, is_causal=True))

    def sample(self, n: int, generator: torch.Generator, temperature: float) -> list[list[int]]:
        """``n`` decision sequences, drawn side by side."""
        taken = torch.zeros(n, 0, dtype=torch.long)
        for index, head in enumerate(self.heads):
            h = self._output(taken)[:, index]
            probs = torch.softmax(head(h) / temperature, dim=-1)
            choice = torch.multinomial(probs, 1, generator=generator)
            taken = torch.cat([taken, choice], dim=1)
        return taken.tolist()

    def score(
        self, choices: list[list[int]], temperature: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability and entropy of each given decision sequence (one pass)."""
        given = torch.tensor(choices)
        out = self._output(given[:, :-1])
        log_prob = entropy = torch.zeros(len(choices))
        for index, head in enumerate(self.heads):
            logp = torch.log_softmax(head(out[:, index]) / temperature, dim=-1)
            log_prob = log_prob + logp.gather(1, given[:, index : index + 1]).squeeze(1)
            entropy = entropy - (logp.exp() * logp).sum(dim=1)
        return log_prob, entropy


_POLICIES = {"lstm": _Policy, "transformer": _TransformerPolicy}
_WALK_AFTER = 10  # results before walks start
_ELITE = 20  # best results kept, where walks start


@register_controller("reinforce")
class Reinforce(Controller):
    """Policy-gradient search: sample architectures from an autoregressive policy (an
    LSTM, or a causal Transformer), and push the policy towards those whose reward beats
    a moving-average baseline.

    Works for any space: the policy has one decision per gene, with as many outputs
    as the gene has values. Updates are batched (``batch_size`` results); results of
    architectures the policy did not ask for are scored under the policy all the same
    (off-policy, as a resumed study or other workers supply them).

    Args:
        space: The search space.
        seed: Seed of the policy's initial weights and of its sampling.
        policy: ``"lstm"`` (Zoph & Le) or ``"transformer"`` (two causal self-attention
            layers, four heads, over the same decision sequence).
        lr: Adam learning rate (Adam's step is insensitive to the reward's scale); by
            default the policy's own (see ``DEFAULT_LR``).
        batch_size: Results per policy update.
        entropy: Weight of the entropy bonus (keeps the policy exploring).
        baseline_decay: Decay of the reward's exponential moving average.
        hidden: Width of the LSTM, or of the Transformer's tokens.
        temperature: Softmax temperature of the decisions.
        max_tries: Policy samples per ask before falling back to mutating one.
        walk: The share of asks, once 10 results are in, that take a predictor-guided
            step to an unseen one-gene neighbour of the best results (as
            :class:`~controllers.RegularizedEvolution` does) instead of sampling the
            policy; the policy learns from those results too. 0.9 found the best cell
            of three synthetic NB201 tables by 150 evaluations in 97 % of seeds with
            the LSTM (0.8: 88 %; plain REINFORCE: 18 % on one) and 95 % with the
            Transformer (0.8: 93 %) (benchmarks/RESULTS.md); 0 is plain REINFORCE.
    """

    seen_state = frozenset({"seen"})
    DEFAULT_LR: ClassVar[dict[str, float]] = {"lstm": 0.1, "transformer": 0.01}

    def __init__(
        self,
        space: SearchSpace,
        *,
        seed: int | None = None,
        policy: str = "lstm",
        lr: float | None = None,
        batch_size: int = 5,
        entropy: float = 1e-3,
        baseline_decay: float = 0.8,
        hidden: int = 32,
        temperature: float = 1.0,
        max_tries: int = 10,
        walk: float = 0.9,
    ) -> None:
        super().__init__(space)
        if not 0 <= walk <= 1:
            raise ConfigError(f"walk is a probability in [0, 1], got {walk}")
        if policy not in _POLICIES:
            raise ConfigError(
                f"Reinforce policy must be one of {', '.join(_POLICIES)}, not {policy!r}"
            )
        self.policy, lr = policy, self.DEFAULT_LR[policy] if lr is None else lr
        self.seed, self.lr, self.batch_size, self.entropy = seed, lr, batch_size, entropy
        self.baseline_decay, self.hidden, self.temperature = baseline_decay, hidden, temperature
        self.max_tries = max_tries
        self._genes = list(space.domains().items())
        self._generator = torch.Generator()
        if seed is not None:
            self._generator.manual_seed(seed)
        else:
            self._generator.seed()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(2**31, (1,), generator=self._generator)))
            self._policy = _POLICIES[policy]([len(d.values()) for _, d in self._genes], hidden)
        self._optimizer = torch.optim.Adam(self._policy.parameters(), lr=lr)
        self._baseline: float | None = None
        self._batch: list[tuple[str, float]] = []
        self._seen: set[str] = set()
        self._updates = 0
        self._fallbacks = 0  # asks that fell back to unseen_architecture
        self.walk = walk
        self._walker = Walker(space, _ELITE)  # the best results, which walks start from
        self._walk_rng = np.random.default_rng([seed or 0, 1])

    # Architectures <-> decision indices --------------------------------------------------
    def _arch(self, choices: list[int]) -> Architecture:
        genes: dict[str, Gene] = {
            g: d.values()[c] for (g, d), c in zip(self._genes, choices, strict=True)
        }
        return self.space.make(genes)

    def _choices(self, arch: Architecture) -> list[int]:
        return [list(d.values()).index(arch[g]) for g, d in self._genes]

    # Controller protocol -------------------------------------------------------------------
    def ask(self) -> Architecture:
        walks = len(self._walker.elite.members) >= _WALK_AFTER
        if walks and self._walk_rng.random() < self.walk:
            step = self._walker.step(self._seen)
            if step is not None:
                self._seen.add(step.arch_id)
                return step
        with torch.no_grad():
            drawn = self._policy.sample(self.max_tries, self._generator, self.temperature)
        for choices in drawn:  # the first draw that is new and within the budget
            arch = self._arch(choices)
            if arch.arch_id not in self._seen and self.space.within_budget(arch):
                break
        else:
            arch = self._mutate_unseen(self._arch(drawn[0]))
        self._seen.add(arch.arch_id)
        return arch

    def _mutate_unseen(self, arch: Architecture) -> Architecture:
        """The policy has converged on seen architectures: explore next to them."""
        seed = int(torch.randint(2**31, (1,), generator=self._generator))
        self._fallbacks += 1
        return unseen_architecture(
            self.space,
            self._seen,
            np.random.default_rng(seed),
            near=arch,
            why=f"the REINFORCE policy sampled only seen architectures {self.max_tries} times "
            f"(it has converged; fallback {self._fallbacks})",
        )

    def tell(self, arch: Architecture, outcome: Outcome) -> None:
        arch = self.space.canonicalize(arch)
        self._seen.add(arch.arch_id)
        if not outcome.ok or outcome.reward is None:
            return  # no reward to learn from
        reward = float(outcome.reward)
        self._walker.add(arch, reward)
        self._baseline = (
            reward
            if self._baseline is None
            else (self.baseline_decay * self._baseline + (1 - self.baseline_decay) * reward)
        )
        self._batch.append((arch.to_json(), reward - self._baseline))
        if len(self._batch) >= self.batch_size:
            self._update()

    def _update(self) -> None:
        choices = [self._choices(Architecture.from_json(a)) for a, _ in self._batch]
        advantage = torch.tensor([adv for _, adv in self._batch])
        log_prob, entropy = self._policy.score(choices, self.temperature)
        self._optimizer.zero_grad()
        (-advantage * log_prob - self.entropy * entropy).mean().backward()
        self._optimizer.step()
        self._batch.clear()
        self._updates += 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": encode(self._policy.state_dict()),
            "optimizer": encode(self._optimizer.state_dict()),
            "generator": encode(self._generator.get_state()),
            "baseline": self._baseline,
            "batch": [list(b) for b in self._batch],
            "seen": sorted(self._seen),
            "updates": self._updates,
            "walker": self._walker.state(),
            "walk_rng": self._walk_rng.bit_generator.state,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._policy.load_state_dict(decode(state["policy"]))
        optimizer = decode(state["optimizer"])
        optimizer["state"] = {int(k): v for k, v in optimizer["state"].items()}
        self._optimizer.load_state_dict(optimizer)
        self._generator.set_state(decode(state["generator"]))
        self._baseline = state["baseline"]
        self._batch = [(a, float(r)) for a, r in state["batch"]]
        self._seen = set(state.get("seen", ()))  # absent: the study calls mark_seen
        self._updates = int(state["updates"])
        self._walker.load(state.get("walker", {"elite": state.get("elite", [])}))
        if "walk_rng" in state:
            self._walk_rng.bit_generator.state = dict(state["walk_rng"])

    def mark_seen(self, arch_ids: Iterable[str]) -> None:
        self._seen.update(arch_ids)

    def reseed(self, stream: int) -> None:
        self._generator.manual_seed(
            int(np.random.SeedSequence([stream, self.seed or 0]).generate_state(1)[0])
        )
        self._walk_rng = np.random.default_rng([stream, self.seed or 0, 1])

    def config(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "policy": self.policy,
            "lr": self.lr,
            "batch_size": self.batch_size,
            "entropy": self.entropy,
            "baseline_decay": self.baseline_decay,
            "hidden": self.hidden,
            "temperature": self.temperature,
            "max_tries": self.max_tries,
            "walk": self.walk,
        }
