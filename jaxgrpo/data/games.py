"""Procedural tasks for the game environments (`jaxgrpo.envs.games`): their examples, seeded and exact."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxgrpo.envs.games import last_integer


def guess_correct(completions: list[str], examples) -> np.ndarray:
    """1 where a completion's last number is the example's secret (a single guess, without feedback), read as
    the game reads a guess (`envs.games.last_integer`)."""
    return np.asarray([float(last_integer(text) == int(example["secret"]))
                       for text, example in zip(completions, examples)], np.float32)


@dataclasses.dataclass
class GuessNumberTask:
    """Secrets for "guess_number": integers in [1, max_number], the train and test splits drawn from separate
    streams of `seed`. Its examples carry "secret", "low", "high" (what the environment reads) and a question and
    answer; single-turn, `guess_correct` scores one guess."""

    seed: int = 0
    max_number: int = 20
    name: str = "guess_number"

    def load(self, split: str, *, data_dir: str | None = None, num_examples: int | None = None) -> list[dict]:
        if split not in ("train", "test"):
            raise ValueError(f"guess_number has splits 'train' and 'test', got {split!r}")
        if self.max_number < 2:
            raise ValueError(f"max_number must be >= 2, got {self.max_number}")
        rng = np.random.default_rng([self.seed, 0 if split == "train" else 1])
        secrets = rng.integers(1, self.max_number + 1, num_examples or 512)
        return [{"secret": int(s), "low": 1, "high": self.max_number,
                 "question": f"Guess the integer from 1 to {self.max_number} I am thinking of.", "answer": str(int(s))}
                for s in secrets]

    def messages(self, example: dict) -> list[dict]:
        return [{"role": "user", "content": example["question"]}]

    def default_rewards(self) -> list:
        return [(guess_correct, 1.0)]

    def reference_completion(self, example: dict) -> str:
        return example["answer"]
