{% include "default/src/environment/fake_model.py" %}

_default_get_messages = get_messages


def get_messages(config: EvaluationRunConfig) -> list[Message]:
    """The default template's scripts, plus the sum-of-squares tasks (one per toolchain)."""
    from environment.tasks.sum_of_squares.fake import messages_for

    scripted = messages_for(config.task_id)
    return scripted if scripted is not None else _default_get_messages(config)
