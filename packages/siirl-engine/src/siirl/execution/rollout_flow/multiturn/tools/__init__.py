"""siiRL's multi-turn tools: the base class ``base_tool.BaseTool`` (schemas in ``schemas``)
and its example ``gsm8k_tool.Gsm8kTool``."""
