"""Multi-turn games with feedback."""

from __future__ import annotations

import re
from typing import Any, Mapping

from jaxgrpo.envs.base import Message, Step


def last_integer(text: str) -> int | None:
    """The last integer written in `text` (a guess), or None."""
    numbers = re.findall(r"-?\d+", text)
    return int(numbers[-1]) if numbers else None


class GuessNumber:
    """Guess a secret integer in [low, high] (an example's "secret", "low", "high"); after each guess the
    environment says "higher", "lower" or "correct". Reward 1 for a correct guess within `max_guesses`, else 0; a
    turn without a number counts as a guess and is told so. Its `state()` is what the feedback so far has
    revealed: the interval the secret must be in, and the guesses left."""

    failure_reward = 0.0

    def __init__(self, max_guesses: int = 6):
        self.max_guesses = int(max_guesses)
        self.secret = self.low = self.high = self.known = None
        self.guesses = 0

    def reset(self, example: Mapping[str, Any]) -> list[Message]:
        self.secret, self.low, self.high = int(example["secret"]), int(example["low"]), int(example["high"])
        if not self.low <= self.secret <= self.high:
            raise ValueError(f"the secret {self.secret} is outside [{self.low}, {self.high}]")
        self.guesses = 0
        self.known = (self.low, self.high)
        return [{"role": "user", "content": f"I am thinking of an integer from {self.low} to {self.high}. Guess it: "
                                            f"answer with one number; I will say higher or lower. You have "
                                            f"{self.max_guesses} guesses."}]

    def step(self, action: str) -> Step:
        self.guesses += 1
        guess = last_integer(action)
        left = self.max_guesses - self.guesses
        if guess == self.secret:
            return Step(None, 1.0, True, {"guesses": self.guesses, "solved": True})
        if left <= 0:
            return Step(None, 0.0, True, {"guesses": self.guesses, "solved": False})
        if guess is None:
            feedback = "That is not a number."
        elif guess < self.secret:
            feedback, self.known = "Higher.", (max(self.known[0], guess + 1), self.known[1])
        else:
            feedback, self.known = "Lower.", (self.known[0], min(self.known[1], guess - 1))
        return Step([{"role": "user", "content": f"{feedback} {left} guesses left."}], 0.0, False,
                    {"guesses": self.guesses})

    def demonstration(self, example: Mapping[str, Any]) -> list[str]:
        """A correct episode: binary search from the middle of [low, high] (at most ceil(log2(high - low + 2))
        guesses; within `max_guesses` when the range is small enough)."""
        secret, low, high = int(example["secret"]), int(example["low"]), int(example["high"])
        guesses = []
        while True:
            guess = (low + high) // 2
            guesses.append(str(guess))
            if guess == secret:
                return guesses
            low, high = (guess + 1, high) if guess < secret else (low, guess - 1)

    def state(self) -> tuple[int, int, int]:
        """(lowest, highest) value the secret can still have after the feedback so far, and the guesses left."""
        return (*self.known, self.max_guesses - self.guesses)
