from environment.tasks._template.task import TemplateTask

TASKS = [TemplateTask]
