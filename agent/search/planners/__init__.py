"""Planners: what proposes the next kernel (an LLM, recorded replies, ...)."""
