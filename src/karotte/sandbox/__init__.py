"""The sandbox side: the harness that runs inside a sandbox (or in-process, `--runtime local`).

It loads the task, confines the student, serves tools, drives the model, scores each step and
writes the transcript. Nothing here starts containers or VMs; that is :mod:`karotte.host`.
"""
