"""Where the data folders are.

Inside the image (the sandbox, and `karotte check --image` during the build) they are at fixed
places; outside a container (`karotte run --runtime local`, tests) they are this environment's own
folders, so the same task code runs in both.

| folder              | in the image        | the student may          |
|---------------------|---------------------|--------------------------|
| student_data/       | /workdir/data       | read and write           |
| shared_data/        | /workdir/shared     | read                     |
| root_data/          | /root_data          | nothing (answers go here)|
| intermediate_data/  | /intermediate_data  | nothing                  |
"""

from __future__ import annotations

import os
from pathlib import Path

ENVIRONMENT_ROOT = Path(__file__).resolve().parents[2]


def in_image() -> bool:
    """True inside the environment's image (sandbox or image build)."""
    return bool(os.environ.get("KAROTTE_SANDBOX")) or Path("/root_data").is_dir()


if in_image():
    STUDENT_DATA = Path("/workdir/data")
    SHARED_DATA = Path("/workdir/shared")
    ROOT_DATA = Path("/root_data")
    INTERMEDIATE_DATA = Path("/intermediate_data")
else:
    STUDENT_DATA = ENVIRONMENT_ROOT / "student_data"
    SHARED_DATA = ENVIRONMENT_ROOT / "shared_data"
    ROOT_DATA = ENVIRONMENT_ROOT / "root_data"
    INTERMEDIATE_DATA = ENVIRONMENT_ROOT / "intermediate_data"
