from environment.tasks.sum_of_squares.task import TASKS

__all__ = ["TASKS"]
