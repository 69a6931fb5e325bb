"""Structured output and tool calling: grammars read from requests, compiled by llguidance,
masks for the sampler, tool prompts and tool-call parsers (docs/structured-output.md)."""
