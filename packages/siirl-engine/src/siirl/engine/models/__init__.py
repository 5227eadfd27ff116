"""Model loading and log-prob helpers shared by the engines."""
