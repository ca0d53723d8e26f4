# /// script
# requires-python = ">=3.11"
# dependencies = []
# ///
"""Prepare the environment's data before an image build: `uv run setup_data.py`.

Download or generate what the tasks need into the data folders (see src/environment/paths.py):
student_data/ (the student's to change), shared_data/ (the student may read), root_data/ and
intermediate_data/ (the student never sees them: answers, scoring data). Add the packages this
script needs to the `dependencies` list above. The default script has nothing to prepare.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent


def main() -> None:
    for name in ("student_data", "shared_data", "root_data", "intermediate_data"):
        (ROOT / name).mkdir(exist_ok=True)
    print("setup_data.py: nothing to prepare (edit it to download or generate data)")


if __name__ == "__main__":
    main()
