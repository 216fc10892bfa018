"""examples/reinforce.py: REINFORCE through the plain Gymnasium API learns when to search."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reinforce.py"


def test_reinforce_example_learns_to_skip_search_on_known_questions(tmp_path):
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--episodes", "3200", "--seed", "0"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    figures = {
        name: (float(a), float(b))
        for name, a, b in re.findall(
            r"P\(search\) on (known|unknown) questions:\s+([\d.]+) -> ([\d.]+)", done.stdout
        )
    }
    # The policy starts uniform (zero weights): P(search) = 0.5 everywhere.
    assert figures["known"][0] == 0.5 and figures["unknown"][0] == 0.5
    # Answering a known question from memory scores 1.0 against at most 0.9 after a search, so
    # search falls away there; an unknown one-hop question scores 0.9 with a search and 0 without.
    assert figures["known"][1] < 0.2
    assert figures["unknown"][1] > 0.7
    first, last = map(
        float, re.search(r"mean reward: ([\d.]+) \(first batch\) -> ([\d.]+)", done.stdout).groups()
    )
    assert last > first
