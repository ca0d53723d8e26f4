from environment.tasks.example_task.task import ExampleTask

TASKS = [ExampleTask]
