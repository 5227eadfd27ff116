"""siiRL's multi-turn tools: ``gsm8k_tool.Gsm8kTool``."""
