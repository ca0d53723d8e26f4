"""Grades step 2 of the example task: `score_answer.py SUBMISSION EXPECTED`.

Run by ExecutableJudge as root on the harness's interpreter. SUBMISSION is the custody copy of
the student's file (also in $KAROTTE_SUBMISSION_0); the verdict goes to $KAROTTE_SCORE_FILE.
"""

import json
import os
import sys
from pathlib import Path

LIMIT = 4096  # the answer is a number: never read more than this


def read_prefix(path: Path) -> str | None:
    try:
        with path.open("rb") as handle:
            return handle.read(LIMIT).decode("utf-8", "replace").strip()
    except OSError:
        return None


def main() -> None:
    submission, expected_file = Path(sys.argv[1]), Path(sys.argv[2])
    expected = expected_file.read_text(encoding="utf-8").strip()
    got = read_prefix(submission) if sys.argv[1] else None
    verdict = {
        "score": 1.0 if got == expected else 0.0,
        "metadata": {"submitted": got if got is None else got[:200]},
    }
    Path(os.environ["KAROTTE_SCORE_FILE"]).write_text(json.dumps(verdict), encoding="utf-8")


if __name__ == "__main__":
    main()
