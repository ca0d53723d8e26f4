"""System prompts shared by the tasks."""

from __future__ import annotations

from environment import paths

DEFAULT_SYSTEM_PROMPT = f"""\
You are an expert software engineer working on a Linux machine through the tools you are given.
Your working directory is {paths.STUDENT_DATA}; shared reference files are in {paths.SHARED_DATA}.
Work step by step, check your results with the tools, and when you are done give your final
answer in a message without calling a tool."""
