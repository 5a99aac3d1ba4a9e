"""Reading jsonl files whose errors name the file and the line."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import TypeVar

from jaxgrpo.errors import DataError

T = TypeVar("T")


def parse_jsonl(path: os.PathLike | str, parse: Callable[[dict], T], what: str) -> Iterator[tuple[int, T]]:
    """Yields (line number, ``parse(record)``) for each non-blank line of ``path``.

    Args:
      path: the jsonl file.
      parse: turns one JSON object into a value; raises ValueError, KeyError or
        TypeError when the object is not what it should be.
      what: what a line should hold, for the error message.

    Raises:
      DataError (a ValueError): ``"<path>:<line>: malformed <what>: <reason>"`` for a line that
        is not a JSON object or that ``parse`` rejects.
    """
    with open(path, encoding="utf-8") as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)  # json.JSONDecodeError is a ValueError.
                if not isinstance(record, dict):
                    raise ValueError(f"expected a JSON object, got {type(record).__name__}")
                value = parse(record)
            except (ValueError, KeyError, TypeError) as error:
                reason = " ".join(str(error).split())  # one line, whatever the parser says
                raise DataError(f"{path}:{line_number}: malformed {what}: {reason}") from error
            yield line_number, value
