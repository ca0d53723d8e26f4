"""Tools served to the agent over MCP. (Being implemented.)"""
