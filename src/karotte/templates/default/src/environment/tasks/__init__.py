"""One package per task (see `environment.get_tasks`). `just create-task ID` adds one."""
