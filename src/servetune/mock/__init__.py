"""Mock OpenAI-compatible server (fault injection, client-ceiling yardstick)."""
