"""Print one of the README's two commands exactly as the README writes them.

    python3 .ci/readme_commands.py main    # the main job on the bundled sample
    python3 .ci/readme_commands.py tests   # the test command

Each is the one line of the first ```bash block after the sentence that introduces it in the
README ("Set up and run the main job ..." and "Run the tests:"). `.ci/run` reads both here
instead of writing them out again, so that CI runs what a newcomer copies and the two cannot
drift apart. Standard library only: it runs before any environment is built.
"""

from __future__ import annotations

import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"

#: The sentence that introduces each command, as the README's text begins it.
INTRODUCED_BY = {
    "main": "Set up and run the main job",
    "tests": "Run the tests:",
}


def readme_command(name: str, text: str) -> str:
    """The one line of the first bash block after the sentence that introduces ``name``.

    Raises:
        ValueError: the sentence, or a one-line bash block after it, is not in ``text``.
    """
    lines = text.splitlines()
    introduction = INTRODUCED_BY[name]
    starts = [i for i, line in enumerate(lines) if line.startswith(introduction)]
    if len(starts) != 1:
        raise ValueError(f"README: {len(starts)} lines begin with {introduction!r}; need one")
    opening = next((i for i in range(starts[0], len(lines)) if lines[i].strip() == "```bash"), None)
    if opening is None:
        raise ValueError(f"README: no ```bash block after {introduction!r}")
    block = []
    for line in lines[opening + 1 :]:
        if line.strip() == "```":
            break
        block.append(line)
    if len(block) != 1 or not block[0].strip():
        raise ValueError(f"README: the block after {introduction!r} must be one command line")
    return block[0].strip()


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in INTRODUCED_BY:
        print(f"usage: readme_commands.py {{{','.join(INTRODUCED_BY)}}}", file=sys.stderr)
        return 2
    try:
        print(readme_command(argv[0], README.read_text()))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
