from karotte.schemas import assistant, tool_call


def get_messages(config):
    pause = config.extra_config.get("pause_s", 0.5)
    calls = config.extra_config.get("calls", 6)
    return [
        assistant(None, [tool_call(f"call_{i}", "bash", command=f"sleep {pause}; echo tick {i}")])
        for i in range(calls)
    ] + [assistant("done")]
