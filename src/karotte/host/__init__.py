"""The host side: CLI support, templates, image build, runtimes, parallel runs.

Nothing here runs inside the sandbox; the sandbox side is :mod:`karotte.sandbox`.
"""
