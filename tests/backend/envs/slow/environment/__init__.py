"""A one-step task whose scripted agent takes a few seconds (backend outage tests)."""

from karotte import Step, Task
from karotte.judges import RegexJudge


class SlowStep(Step):
    @property
    def instructions(self):
        return "Run the commands, then say done."

    @property
    def judge(self):
        return RegexJudge(r"\bdone\b")


class SlowTask(Task):
    id = "slow"

    @property
    def system_prompt(self):
        return "You are patient."

    @property
    def tools(self):
        return ["bash"]

    @property
    def steps(self):
        return [SlowStep(config=self.config)]


def get_tasks():
    return [SlowTask]
