"""Offline distillation of large sentence-embedding teachers into compact students."""
