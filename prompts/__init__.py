"""The prompt templates (*.j2), installed as optagent.prompt_templates; agent/prompts.py renders them."""
