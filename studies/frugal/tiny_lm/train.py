"""One arm of the tiny-LM study: warm start, GRPO, held-out evaluation table.

python -m studies.frugal.tiny_lm.train --config studies/frugal/tiny_lm/lightsearcher.yaml
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from searchgym.policies.evaluation import format_table
from studies.frugal.tiny_lm.config import load_run_config
from studies.frugal.tiny_lm.pipeline import run_pipeline
from studies.frugal.tiny_lm.runner import _log_progress


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="run config with sft and/or eval")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    args = parser.parse_args(argv)
    config = load_run_config(args.config)
    _log_progress()
    result = run_pipeline(config, progress=not args.no_progress)
    if result.evaluation is not None:
        print(format_table([result.evaluation]))
        print(f"eval: {Path(config.output_dir) / 'eval.json'}", file=sys.stderr)
    state = result.state
    print(
        f"done: {state.step} steps; checkpoints in {Path(config.output_dir) / 'checkpoints'}", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
