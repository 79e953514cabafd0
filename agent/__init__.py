"""optagent: an LLM-in-the-loop GPU kernel optimizer for contest task packages."""

__version__ = "0.1.0"
